rule train_toyclip:
    """The learned toy reward (the HPS analogue): a contrastive image-text scorer with hard negatives."""
    input:
        world=f"{DATA}/world.json",
    output:
        model=directory(f"{TOYCLIP}/model"),
        metrics=f"{TOYCLIP}/metrics.json",
    params:
        cfg=lambda wc: json.dumps(config["toyclip"]),
    threads: config["threads"]
    resources:
        gpu=GPU,
        **slurm("train_toyclip"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/train_toyclip/{os.path.basename(TOYCLIP)}.log",
    benchmark:
        f"timings/train_toyclip/{os.path.basename(TOYCLIP)}.tsv"
    shell:
        "margrpo train-toyclip --world {input.world:q} --config-json {params.cfg:q}"
        " --out-dir {output.model:q} --metrics {output.metrics:q} --threads {threads:q} > {log:q} 2>&1"


rule train_toypref:
    """The toy preference reward (the HPS analogue): toyclip fine-tuned on pairs that prefer the aligned image and,
    at equal alignment, the brighter backdrop."""
    input:
        world=f"{DATA}/world.json",
        toyclip=f"{TOYCLIP}/model",
    output:
        model=directory(f"{TOYPREF}/model"),
        metrics=f"{TOYPREF}/metrics.json",
    params:
        cfg=lambda wc: json.dumps(config["toypref"]),
    threads: config["threads"]
    resources:
        gpu=GPU,
        **slurm("train_toypref"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/train_toypref/{os.path.basename(TOYPREF)}.log",
    benchmark:
        f"timings/train_toypref/{os.path.basename(TOYPREF)}.tsv"
    shell:
        "margrpo train-toypref --world {input.world:q} --toyclip-dir {input.toyclip:q} --config-json {params.cfg:q}"
        " --out-dir {output.model:q} --metrics {output.metrics:q} --threads {threads:q} > {log:q} 2>&1"


rule pretrain:
    """A toy MAR base policy trained from scratch on ShapesWorld (resumes from its folder's state/ if the spec matches)."""
    input:
        world=f"{DATA}/world.json",
        suite=f"{DATA}/eval.jsonl",
    output:
        policy=directory(f"{RESULTS}/pretrain/{{pretrained}}/policy"),
        quality=f"{RESULTS}/pretrain/{{pretrained}}/quality.json",
        samples=f"{RESULTS}/pretrain/{{pretrained}}/samples.png",
    params:
        cfg=lambda wc: json.dumps(pretrain_settings(config["policies"][PRETRAINED[wc.pretrained]])),
        precision=config["mixed_precision"],
    threads: config["threads"]
    resources:
        gpu=GPU,
        **slurm("pretrain"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        "logs/pretrain/{pretrained}.log",
    benchmark:
        "timings/pretrain/{pretrained}.tsv"
    shell:
        "margrpo pretrain --world {input.world:q} --eval-suite {input.suite:q} --policy-json {params.cfg:q}"
        " --out-dir {output.policy:q} --quality {output.quality:q} --samples-png {output.samples:q} --precision {params.precision:q}"
        " --threads {threads:q} > {log:q} 2>&1"


rule check_weights:
    """Real-scale weights load from a local folder or a Hugging Face repository id in the local cache (margrpo.infra.weights,
    as `margrpo weights`): fail early, naming the files expected there; policy.json points at the resolved folder."""
    output:
        f"{RESULTS}/weights/{{weights}}/policy.json",
    params:
        kind=lambda wc: config["policies"][WEIGHTS[wc.weights]]["kind"],
        path=lambda wc: config["policies"][WEIGHTS[wc.weights]]["path"],
    conda:
        "../../envs/margrpo.yaml"
    log:
        "logs/check_weights/{weights}.log",
    benchmark:
        "timings/check_weights/{weights}.tsv"
    resources:
        **SITE,
    shell:
        "margrpo check-weights --kind {params.kind:q} --path {params.path:q} --out {output:q} > {log:q} 2>&1"
