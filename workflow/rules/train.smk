# GRPO runs write their checkpoints under <run>/state (not a declared output), so a killed job
# rerun with --rerun-incomplete resumes instead of starting over. --restart: a rerun for changed settings
# moves the old state to <run>/aside-<time>/ (nothing is deleted) where a run by hand would stop and say why.


TRAIN_LOG = f"logs/{NAME}/{{kind}}/{{policy}}/{{reward}}/{{setting}}/seed{{seed}}.log"


rule train:
    """A GRPO run. `kind` train: the training ladder (grpo / fix / mte / sim, per base policy, reward setting and
    seed; `setting` is the variant). `kind` ablation: a Fig. 7 grid point (k, tau, S) of config/ablations.tsv, the
    ablations' variant with the point's values (`setting` is the point's Paramspace name, e.g. top_frac~0.3_tau~0.0_trajectories~4)."""
    input:
        policy=get_base_policy,
        suites=get_suites(),
        rewards=get_reward_inputs,
    output:
        summary=f"{RUNS}/{{kind}}/{{policy}}/{{reward}}/{{setting}}/seed{{seed}}/summary.json",
        metrics=f"{RUNS}/{{kind}}/{{policy}}/{{reward}}/{{setting}}/seed{{seed}}/metrics.csv",
    wildcard_constraints:
        kind="train|ablation",
        policy=POLICY_NAMES,  # toy-mask / toy-marval runs are train_related's
        setting=TRAIN_SETTINGS,
    params:
        spec=get_train_spec,
        run_dir=lambda wc, output: os.path.dirname(output.summary),
        suites_dir=lambda wc, input: os.path.dirname(input.suites[0]),
        toyclip=f"{TOYCLIP}/model",
        toypref=f"{TOYPREF}/model",
        launch=TRAIN_LAUNCH,
        threads=config["threads"],  # per process
        # Snakemake deletes a job's log before each run (a retry, a requeued job's next segment): every segment is
        # appended here, headed with its job id, restart count and time, and the log is a copy of it
        segments=lambda wc: TRAIN_LOG.format(**dict(wc.items())) + ".segments",
        requeues=config["slurm"]["requeues"],  # a planned stop inside SLURM requeues the job (infra.slurm.after_stop)
    threads: config["threads"] * TRAIN_PROCS
    resources:
        **TRAIN_RESOURCES,
        **slurm("train"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        TRAIN_LOG,
    benchmark:
        f"timings/{NAME}/{{kind}}/{{policy}}/{{reward}}/{{setting}}/seed{{seed}}.tsv"
    shell:
        "{params.launch} train --policy-dir {input.policy:q} --suites-dir {params.suites_dir:q} --spec-json {params.spec:q}"
        " --toyclip-dir {params.toyclip:q} --toypref-dir {params.toypref:q} --seed {wildcards.seed:q} --out-dir {params.run_dir:q}"
        " --threads {params.threads:q} --restart --requeues {params.requeues:q} >> {params.segments:q} 2>&1 || status=$?;"
        " cp {params.segments:q} {log:q}; exit ${{status:-0}}"
