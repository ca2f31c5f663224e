rule warmup:
    """Head-only fine-tuning before RL (Harmon warm-up, design.md §3.11), a checkpoint of its own."""
    input:
        policy=lambda wc: get_loaded_policy(WARMED[wc.warmed]),
        world=f"{DATA}/world.json",
        suite=f"{DATA}/eval.jsonl",
    output:
        policy=directory(f"{RESULTS}/warmup/{{warmed}}/policy"),
        quality=f"{RESULTS}/warmup/{{warmed}}/quality.json",
        samples=f"{RESULTS}/warmup/{{warmed}}/samples.png",
    params:
        cfg=lambda wc: json.dumps(config["policies"][WARMED[wc.warmed]]["warmup"]),
        sampling=lambda wc: json.dumps(config["policies"][WARMED[wc.warmed]]["sampling"]),
        precision=config["mixed_precision"],
    threads: config["threads"]
    resources:
        gpu=GPU,
        **slurm("warmup"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        "logs/warmup/{warmed}.log",
    benchmark:
        "timings/warmup/{warmed}.tsv"
    shell:
        "margrpo warmup --policy-dir {input.policy:q} --world {input.world:q} --eval-suite {input.suite:q}"
        " --warmup-json {params.cfg:q} --sampling-json {params.sampling:q} --out-dir {output.policy:q} --quality {output.quality:q} --samples-png {output.samples:q}"
        " --precision {params.precision:q} --threads {threads:q} > {log:q} 2>&1"
