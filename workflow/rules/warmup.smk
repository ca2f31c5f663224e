rule warmup:
    """Head-only fine-tuning before RL (Harmon warm-up, DESIGN 3.11), a checkpoint of its own."""
    input:
        policy=lambda wc: get_loaded_policy(wc.policy),
        world=f"{RESULTS}/data/suites/world.json",
        suite=f"{RESULTS}/data/suites/eval.jsonl",
    output:
        policy=directory(f"{RESULTS}/warmup/{{policy}}/policy"),
        quality=f"{RESULTS}/warmup/{{policy}}/quality.json",
        samples=f"{RESULTS}/warmup/{{policy}}/samples.png",
    params:
        cfg=lambda wc: json.dumps(config["policies"][wc.policy]["warmup"]),
        sampling=lambda wc: json.dumps(config["policies"][wc.policy]["sampling"]),
        precision=config["mixed_precision"],
    threads: config["threads"]
    resources:
        gpu=GPU,
        runtime=120,
    conda:
        "../../envs/margrpo.yaml"
    log:
        "logs/warmup/{policy}.log",
    benchmark:
        "benchmarks/warmup/{policy}.tsv"
    shell:
        "margrpo warmup --policy-dir {input.policy} --world {input.world} --eval-suite {input.suite}"
        " --warmup-json {params.cfg:q} --sampling-json {params.sampling:q} --out-dir {output.policy} --quality {output.quality} --samples-png {output.samples}"
        " --precision {params.precision} --threads {threads} > {log} 2>&1"
