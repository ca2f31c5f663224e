# Table 3 (issue #19): MAR-GRPO beside MARVAL (toy-marval: the teacher's head distilled to one step) and
# MaskGRPO (toy-mask: a discrete masked-token toy), each against its own base. Their runs use the run ids
# and files of the ladder (train/<policy>/<reward>/<method>/seed<s>, base/<policy>), so `select`, `sample`,
# the evaluations and the report read them unchanged. Off unless experiments.related.enabled.


rule pretrain_mask:
    """toy-mask: the discrete masked-token base policy, trained from scratch on ShapesWorld."""
    input:
        world=f"{DATA}/world.json",
        suite=f"{DATA}/eval.jsonl",
    output:
        policy=directory(f"{RELATED_DIRS.get('toy-mask', 'unused')}/policy"),
        quality=f"{RELATED_DIRS.get('toy-mask', 'unused')}/quality.json",
    params:
        cfg=lambda wc: json.dumps(related_policy(config, "toy-mask")),
    threads: config["threads"]
    resources:
        gpu=GPU,
        **slurm("pretrain_mask"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        "logs/pretrain_mask/toy-mask.log",
    benchmark:
        "timings/pretrain_mask/toy-mask.tsv"
    shell:
        "margrpo pretrain-mask --world {input.world:q} --eval-suite {input.suite:q} --policy-json {params.cfg:q}"
        " --out-dir {output.policy:q} --quality {output.quality:q} --threads {threads:q} > {log:q} 2>&1"


rule distill_marval:
    """toy-marval: the teacher's diffusion head distilled to one Gaussian step (MARVAL's variational objective)."""
    input:
        teacher=lambda wc: get_base_policy(SimpleNamespace(policy=EXP["related"]["marval"]["teacher"])),
        suites=get_suites(),
    output:
        policy=directory(f"{RELATED_DIRS.get('toy-marval', 'unused')}/policy"),
        quality=f"{RELATED_DIRS.get('toy-marval', 'unused')}/quality.json",
    params:
        cfg=lambda wc: json.dumps(related_policy(config, "toy-marval")),
        suites_dir=lambda wc, input: os.path.dirname(input.suites[0]),
    threads: config["threads"]
    resources:
        gpu=GPU,
        **slurm("distill_marval"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        "logs/distill_marval/toy-marval.log",
    benchmark:
        "timings/distill_marval/toy-marval.tsv"
    shell:
        "margrpo distill-marval --teacher {input.teacher:q} --suites-dir {params.suites_dir:q} --policy-json {params.cfg:q}"
        " --out-dir {output.policy:q} --quality {output.quality:q} --threads {threads:q} > {log:q} 2>&1"


rule train_related:
    """A related method's RL run: GRPO on the one-step policy (`margrpo train`, |T| = 1), MARVAL-RL, or plain
    GRPO / MaskGRPO on toy-mask (`margrpo train-related`)."""
    input:
        policy=lambda wc: f"{RELATED_DIRS[wc.relpolicy]}/policy",
        suites=get_suites(),
        rewards=get_reward_inputs,
    output:
        summary=f"{RUNS}/train/{{relpolicy}}/{{reward}}/{{method}}/seed{{seed}}/summary.json",
        metrics=f"{RUNS}/train/{{relpolicy}}/{{reward}}/{{method}}/seed{{seed}}/metrics.csv",
    wildcard_constraints:
        relpolicy="toy-mask|toy-marval",
        method="grpo-onestep|marval-rl|grpo-mask|maskgrpo",
    params:
        command=lambda wc: "train" if wc.method == "grpo-onestep" else f"train-related --method {wc.method}",
        spec=lambda wc: json.dumps(related_train_spec(config, wc.method)),
        run_dir=lambda wc, output: os.path.dirname(output.summary),
        suites_dir=lambda wc, input: os.path.dirname(input.suites[0]),
        toyclip=f"{TOYCLIP}/model",
        toypref=f"{TOYPREF}/model",
        # every segment of the run (a retry's) appended, headed with its time (and job), the log a copy: Snakemake
        # deletes a job's log before each run (as the train rule)
        segments=lambda wc: f"logs/{NAME}/train/{wc.relpolicy}/{wc.reward}/{wc.method}/seed{wc.seed}.log.segments",
    threads: config["threads"]
    resources:
        gpu=GPU,
        **slurm("train_related"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/train/{{relpolicy}}/{{reward}}/{{method}}/seed{{seed}}.log",
    benchmark:
        f"timings/{NAME}/train/{{relpolicy}}/{{reward}}/{{method}}/seed{{seed}}.tsv"
    shell:
        "margrpo {params.command} --policy-dir {input.policy:q} --suites-dir {params.suites_dir:q} --spec-json {params.spec:q}"
        " --toyclip-dir {params.toyclip:q} --toypref-dir {params.toypref:q} --seed {wildcards.seed:q} --out-dir {params.run_dir:q}"
        " --threads {threads:q} --restart >> {params.segments:q} 2>&1 || status=$?;"
        " cp {params.segments:q} {log:q}; exit ${{status:-0}}"


rule table3:
    """Table 3: each method's gain over its own base (validation reward, CompBench-style), and its seconds per RL step."""
    input:
        get_eval_outputs(related_bases() + related_runs()),
        expand(f"{RUNS}/select/{{run}}/selection.json", run=related_runs()),
    output:
        report(f"{REPORT}/table3.csv", caption="../report/table3.rst", category=CATEGORY_RELATED, subcategory="tables"),
        f"{REPORT}/table3.md",
        f"{REPORT}/table3.tex",
    params:
        runs=json.dumps(related_spec()),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/table3.log",
    benchmark:
        f"timings/{NAME}/report/table3.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("table3")


rule fig_related_wallclock:
    """Validation reward against RL wall-clock, one line per method (mean and band over seeds)."""
    input:
        expand(f"{RUNS}/{{run}}/metrics.csv", run=related_runs()),
        expand(f"{RUNS}/{{run}}/summary.json", run=related_runs()),
    output:
        report(
            expand(f"{REPORT}/fig_related_wallclock.{{ext}}", ext=config["report"]["formats"]),
            caption="../report/fig_related_wallclock.rst",
            category=CATEGORY_RELATED,
            subcategory="figures",
        ),
    params:
        runs=json.dumps(related_spec()),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/fig_related_wallclock.log",
    benchmark:
        f"timings/{NAME}/report/fig_related_wallclock.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("related-wallclock")
