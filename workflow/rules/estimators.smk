# The ladder's gradient estimators at the base policy (experiments.estimators; margrpo.stages.estimators): the exact
# gradient of the expected reward once per base, then one job per estimator over the same batch seeds. The report
# rule `estimators` and the claims (h-j) read what they write.


rule exact_gradient:
    """The exact (pathwise) gradient of the expected reward at the base, in parts (their halves' cosine recorded)."""
    input:
        **ESTIMATOR_INPUTS,
    output:
        exact=f"{ESTIMATES}/{{policy}}/{{reward}}/exact.pt",
        record=f"{ESTIMATES}/{{policy}}/{{reward}}/exact.json",
    wildcard_constraints:
        policy=POLICY_NAMES,
    params:
        **ESTIMATOR_PARAMS,
        images=EXP["estimators"]["exact_images"],
        parts=EXP["estimators"]["exact_parts"],
    threads: config["threads"]
    resources:
        **SITE,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/estimators/{{policy}}/{{reward}}/exact.log",
    benchmark:
        f"timings/{NAME}/estimators/{{policy}}/{{reward}}/exact.tsv"
    shell:
        "margrpo exact-gradient --spec-json {params.spec:q} --policy-dir {input.policy:q} --suites-dir {params.suites_dir:q}"
        " --toyclip-dir {params.toyclip:q} --toypref-dir {params.toypref:q} --out-dir {params.out_dir:q} --threads {threads:q}"
        " --images {params.images:q} --parts {params.parts:q} > {log:q} 2>&1"


rule gradient_estimator:
    """One estimator's B batch gradients at the base (the same batch seeds as every other), against the exact one."""
    input:
        **ESTIMATOR_INPUTS,
        exact=f"{ESTIMATES}/{{policy}}/{{reward}}/exact.pt",
    output:
        f"{ESTIMATES}/{{policy}}/{{reward}}/{{estimator}}/batches.json",
    wildcard_constraints:
        policy=POLICY_NAMES,
        estimator="fix|mte|sim|committed|every_step|pathwise",
    params:
        **ESTIMATOR_PARAMS,
        batches=EXP["estimators"]["batches"],
    threads: config["threads"]
    resources:
        **SITE,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/estimators/{{policy}}/{{reward}}/{{estimator}}.log",
    benchmark:
        f"timings/{NAME}/estimators/{{policy}}/{{reward}}/{{estimator}}.tsv"
    shell:
        "margrpo gradient-estimator --estimator {wildcards.estimator:q} --spec-json {params.spec:q} --policy-dir {input.policy:q}"
        " --suites-dir {params.suites_dir:q} --toyclip-dir {params.toyclip:q} --toypref-dir {params.toypref:q}"
        " --out-dir {params.out_dir:q} --threads {threads:q} --batches {params.batches:q} > {log:q} 2>&1"


rule checkpoint_gradient:
    """The AR part's B batch gradients (+Fix's estimator) at a ladder run's saved checkpoint: claim b along training,
    over the base's first B batch seeds (the same prompts and noise at every checkpoint)."""
    input:
        **ESTIMATOR_INPUTS,
        run=f"{RUNS}/train/{{policy}}/{{reward}}/{{variant}}/seed{{seed}}/summary.json",
        exact=f"{ESTIMATES}/{{policy}}/{{reward}}/exact.pt",
    output:
        f"{ESTIMATES}/{{policy}}/{{reward}}/checkpoints/{{variant}}/seed{{seed}}/step{{step}}/fix/batches.json",
    wildcard_constraints:
        policy=POLICY_NAMES,
        step=r"\d+",
        seed=r"\d+",
    params:
        **ESTIMATOR_PARAMS,
        checkpoint=lambda wc, input: checkpoint_policy(input.run, int(wc.step)),
        folder=lambda wc, output: os.path.dirname(os.path.dirname(output[0])),
        batches=EXP["estimators"]["checkpoints"]["batches"],
    threads: config["threads"]
    resources:
        **SITE,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/estimators/{{policy}}/{{reward}}/checkpoints/{{variant}}-seed{{seed}}-step{{step}}.log",
    benchmark:
        f"timings/{NAME}/estimators/{{policy}}/{{reward}}/checkpoints/{{variant}}-seed{{seed}}-step{{step}}.tsv"
    shell:
        "margrpo gradient-estimator --estimator fix --spec-json {params.spec:q} --policy-dir {params.checkpoint:q}"
        " --exact {input.exact:q} --suites-dir {params.suites_dir:q} --toyclip-dir {params.toyclip:q}"
        " --toypref-dir {params.toypref:q} --out-dir {params.folder:q} --threads {threads:q} --batches {params.batches:q}"
        " > {log:q} 2>&1"
