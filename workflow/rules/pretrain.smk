rule train_toyclip:
    """The learned toy reward (the HPS analogue): a contrastive image-text scorer with hard negatives."""
    input:
        world=f"{RESULTS}/data/suites/world.json",
    output:
        model=directory(f"{RESULTS}/toyclip/model"),
        metrics=f"{RESULTS}/toyclip/metrics.json",
    params:
        cfg=lambda wc: json.dumps(config["toyclip"]),
    threads: config["threads"]
    resources:
        gpu=GPU,
    conda:
        "../../envs/margrpo.yaml"
    log:
        "logs/train_toyclip/train_toyclip.log",
    benchmark:
        "benchmarks/train_toyclip/train_toyclip.tsv"
    shell:
        "margrpo train-toyclip --world {input.world} --config-json {params.cfg:q}"
        " --out-dir {output.model} --metrics {output.metrics} --threads {threads} > {log} 2>&1"


rule pretrain:
    """A toy MAR base policy trained from scratch on ShapesWorld (resumes from results/pretrain/<policy>/state)."""
    input:
        world=f"{RESULTS}/data/suites/world.json",
        suite=f"{RESULTS}/data/suites/eval.jsonl",
    output:
        policy=directory(f"{RESULTS}/pretrain/{{policy}}/policy"),
        quality=f"{RESULTS}/pretrain/{{policy}}/quality.json",
        samples=f"{RESULTS}/pretrain/{{policy}}/samples.png",
    params:
        cfg=lambda wc: pretrain_settings(wc.policy),
        precision=config["mixed_precision"],
    threads: config["threads"]
    resources:
        gpu=GPU,
        runtime=120,
    conda:
        "../../envs/margrpo.yaml"
    log:
        "logs/pretrain/{policy}.log",
    benchmark:
        "benchmarks/pretrain/{policy}.tsv"
    shell:
        "margrpo pretrain --world {input.world} --eval-suite {input.suite} --policy-json {params.cfg:q}"
        " --out-dir {output.policy} --quality {output.quality} --samples-png {output.samples} --precision {params.precision}"
        " --threads {threads} > {log} 2>&1"


rule check_weights:
    """Real-scale weights load from a local folder: fail early, naming the files expected there."""
    output:
        f"{RESULTS}/weights/{{policy}}/policy.json",
    params:
        kind=lambda wc: config["policies"][wc.policy]["kind"],
        path=lambda wc: config["policies"][wc.policy]["path"],
    conda:
        "../../envs/margrpo.yaml"
    log:
        "logs/check_weights/{policy}.log",
    benchmark:
        "benchmarks/check_weights/{policy}.tsv"
    shell:
        "margrpo check-weights --kind {params.kind} --path {params.path:q} --out {output} > {log} 2>&1"
