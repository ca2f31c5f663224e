# GRPO runs write their checkpoints under <run>/state (not a declared output), so a killed job
# rerun with --rerun-incomplete resumes instead of starting over.


rule train:
    """The training ladder: grpo / fix / mte / sim, per base policy, reward setting and seed."""
    input:
        policy=get_base_policy,
        suites=get_suites(),
        rewards=get_reward_inputs,
    output:
        summary=f"{RUNS}/train/{{policy}}/{{reward}}/{{variant}}/seed{{seed}}/summary.json",
        metrics=f"{RUNS}/train/{{policy}}/{{reward}}/{{variant}}/seed{{seed}}/metrics.csv",
    wildcard_constraints:
        policy=POLICY_NAMES,  # toy-mask / toy-marval runs are train_related's
    params:
        spec=get_train_spec,
        run_dir=lambda wc, output: os.path.dirname(output.summary),
        suites_dir=lambda wc, input: os.path.dirname(input.suites[0]),
        toyclip=f"{TOYCLIP}/model",
        toypref=f"{TOYPREF}/model",
        launch=TRAIN_LAUNCH,
        threads=config["threads"],  # per process
    threads: config["threads"] * TRAIN_PROCS
    resources:
        **TRAIN_RESOURCES,
        runtime=240,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/train/{{policy}}/{{reward}}/{{variant}}/seed{{seed}}.log",
    benchmark:
        f"timings/{NAME}/train/{{policy}}/{{reward}}/{{variant}}/seed{{seed}}.tsv"
    shell:
        "{params.launch} train --policy-dir {input.policy:q} --suites-dir {params.suites_dir:q} --spec-json {params.spec:q}"
        " --toyclip-dir {params.toyclip:q} --toypref-dir {params.toypref:q} --seed {wildcards.seed:q} --out-dir {params.run_dir:q}"
        " --threads {params.threads:q} > {log:q} 2>&1"


rule train_ablation:
    """Fig. 7 grid points (k, tau, S) from config/ablations.tsv via Paramspace."""
    input:
        policy=get_base_policy,
        suites=get_suites(),
        rewards=get_reward_inputs,
    output:
        summary=f"{RUNS}/ablation/{{policy}}/{{reward}}/{ABLATIONS.wildcard_pattern}/seed{{seed}}/summary.json",
        metrics=f"{RUNS}/ablation/{{policy}}/{{reward}}/{ABLATIONS.wildcard_pattern}/seed{{seed}}/metrics.csv",
    params:
        spec=get_ablation_spec,
        run_dir=lambda wc, output: os.path.dirname(output.summary),
        suites_dir=lambda wc, input: os.path.dirname(input.suites[0]),
        toyclip=f"{TOYCLIP}/model",
        toypref=f"{TOYPREF}/model",
        launch=TRAIN_LAUNCH,
        threads=config["threads"],  # per process
    threads: config["threads"] * TRAIN_PROCS
    resources:
        **TRAIN_RESOURCES,
        runtime=240,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/train_ablation/{{policy}}/{{reward}}/{ABLATIONS.wildcard_pattern}/seed{{seed}}.log",
    benchmark:
        f"timings/{NAME}/train_ablation/{{policy}}/{{reward}}/{ABLATIONS.wildcard_pattern}/seed{{seed}}.tsv"
    shell:
        "{params.launch} train --policy-dir {input.policy:q} --suites-dir {params.suites_dir:q} --spec-json {params.spec:q}"
        " --toyclip-dir {params.toyclip:q} --toypref-dir {params.toypref:q} --seed {wildcards.seed:q} --out-dir {params.run_dir:q}"
        " --threads {params.threads:q} > {log:q} 2>&1"
