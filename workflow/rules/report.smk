# Tables and figures read result files only: deleting one reruns its rule alone, and changing a
# plot option reruns no training (training rules never see the `report` config section).
# `snakemake --report report.html` (make report-html) collects them with the captions in workflow/report/.


report: "../report/workflow.rst"


# categories of the HTML report: one per experiment of the config
CATEGORY_LADDER, CATEGORY_TABLE1, CATEGORY_ABLATIONS = "ladder: Table 2, Fig. 2, 4, 6", "table1: Table 1", "ablations: Fig. 7"
CATEGORY_RELATED = "related: Table 3 (MARVAL, MaskGRPO)"


rule table1:
    """Table 1: each base policy, +GRPO and Ours; preference metrics and CompBench categories."""
    input:
        get_eval_outputs(base_runs() + table1_runs()),
        warmups=table1_warmups().values(),
    output:
        report(f"{REPORT}/table1.csv", caption="../report/table1.rst", category=CATEGORY_TABLE1, subcategory="tables"),
        f"{REPORT}/table1.md",
        f"{REPORT}/table1.tex",
    params:
        runs=json.dumps({"base": base_runs(), "runs": table1_runs(), "baseline": EXP["table1"]["baseline"], "ours": EXP["table1"]["ours"],
                         "warmups": table1_warmups()}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/table1.log",
    benchmark:
        f"timings/{NAME}/report/table1.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("table1")


rule table2:
    """Table 2: base, GRPO*, +Fix*, +MTE, +Sim (mean and 95% CI over seeds; * = best checkpoint)."""
    input:
        get_eval_outputs(base_runs() + ladder_runs() + climb_runs()),
        expand(f"{RUNS}/select/{{run}}/selection.json", run=ladder_runs() + climb_runs()),
    output:
        report(f"{REPORT}/table2.csv", caption="../report/table2.rst", category=CATEGORY_LADDER, subcategory="tables"),
        f"{REPORT}/table2.md",
        f"{REPORT}/table2.tex",
    params:
        runs=json.dumps(ladders_spec()),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/table2.log",
    benchmark:
        f"timings/{NAME}/report/table2.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("table2")


rule val_gain:
    """Each variant's validation-reward gain over the base policy, per validation step (did RL lift the reward?)."""
    input:
        expand(f"{RUNS}/{{run}}/{{f}}", run=ladder_runs() + climb_runs(), f=["metrics.csv", "summary.json"]),
    output:
        report(f"{REPORT}/val_gain.csv", caption="../report/val_gain.rst", category=CATEGORY_LADDER, subcategory="tables"),
        f"{REPORT}/val_gain.md",
        f"{REPORT}/val_gain.tex",
    params:
        runs=json.dumps(ladders_spec()),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/val_gain.log",
    benchmark:
        f"timings/{NAME}/report/val_gain.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("val-gain")


rule claims:
    """The paper's claims as paired differences (common random numbers within a seed), with CIs and verdicts."""
    input:
        expand(f"{RUNS}/{{run}}/{{f}}", run=ladder_runs() + climb_runs() + ablation_runs(), f=["metrics.csv", "summary.json"]),
        expand(f"{RUNS}/select/{{run}}/selection.json", run=ladder_runs() + climb_runs()),
        expand(f"{RUNS}/eval/{{run}}/compbench_per_image.csv", run=base_runs() + ladder_runs() + climb_runs()),
        estimator_outputs(),  # claims h-j, where experiments.estimators is on
        checkpoint_outputs(),  # claim b at trained checkpoints, where experiments.estimators.checkpoints names variants
    output:
        report(f"{REPORT}/claims.csv", caption="../report/claims.rst", category=CATEGORY_LADDER, subcategory="tables"),
        f"{REPORT}/claims_paired.csv",
        f"{REPORT}/claims.md",
    params:
        runs=json.dumps({**ladders_spec(), "ablations": ablation_runs(),
                         "replicate_seeds": EXP["ladder"]["replicate_seeds"],
                         "estimators": [estimator_block()] if EXP["estimators"]["enabled"] else []}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/claims.log",
    benchmark:
        f"timings/{NAME}/report/claims.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("claims")


rule fig_climb:
    """The climbing ladder: validation reward against step, each rung beside the shuffled-advantage control."""
    input:
        expand(f"{RUNS}/{{run}}/{{f}}", run=climb_runs(), f=["metrics.csv", "summary.json"]),
    output:
        report(
            expand(f"{REPORT}/fig_climb.{{ext}}", ext=config["report"]["formats"]),
            caption="../report/fig_climb.rst",
            category=CATEGORY_LADDER,
            subcategory="figures",
        ),
    params:
        runs=json.dumps({"runs": climb_runs(), "variants": EXP["climb"]["variants"], "control": EXP["climb"]["control"]}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/fig_climb.log",
    benchmark:
        f"timings/{NAME}/report/fig_climb.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("fig-climb")


rule fig2_dynamics:
    """Fig. 2a/2b and Fig. 5: AR gradient norm and variance, validation reward and KL over steps."""
    input:
        expand(f"{RUNS}/{{run}}/{{f}}", run=ladder_runs(), f=["metrics.csv", "summary.json"]),  # summary: freeze_ar
    output:
        report(
            expand(f"{REPORT}/fig2_dynamics.{{ext}}", ext=config["report"]["formats"]),
            caption="../report/fig2_dynamics.rst",
            category=CATEGORY_LADDER,
            subcategory="figures",
        ),
    params:
        runs=json.dumps({"runs": ladder_runs()}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/fig2_dynamics.log",
    benchmark:
        f"timings/{NAME}/report/fig2_dynamics.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("dynamics")


rule uncertainty_maps:
    """Per-token MTE uncertainty of the base policy (data for Fig. 4)."""
    input:
        policy=lambda wc: get_base_policy(type("W", (), {"policy": EXP["ladder"]["policies"][0]})),
        suite=f"{DATA}/eval.jsonl",
    output:
        f"{RUNS}/uncertainty/maps.npz",
    params:
        sampling=json.dumps(config["policies"][EXP["ladder"]["policies"][0]]["sampling"]),
        n=config["report"]["grid_prompts"],
    threads: config["threads"]
    resources:
        gpu=GPU,
        **slurm("uncertainty_maps"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/uncertainty_maps/maps.log",
    benchmark:
        f"timings/{NAME}/uncertainty_maps/maps.tsv"
    shell:
        "margrpo uncertainty --policy {input.policy:q} --suite {input.suite:q} --sampling-json {params.sampling:q}"
        " --prompts {params.n:q} --trajectories 4 --out {output:q} --threads {threads:q} > {log:q} 2>&1"


rule fig4_uncertainty:
    """Fig. 4: samples beside their per-token uncertainty maps."""
    input:
        f"{RUNS}/uncertainty/maps.npz",
    output:
        report(
            expand(f"{REPORT}/fig4_uncertainty.{{ext}}", ext=config["report"]["formats"]),
            caption="../report/fig4_uncertainty.rst",
            category=CATEGORY_LADDER,
            subcategory="figures",
        ),
    params:
        runs=json.dumps({"maps": f"{RUNS}/uncertainty/maps.npz"}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/fig4_uncertainty.log",
    benchmark:
        f"timings/{NAME}/report/fig4_uncertainty.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("uncertainty")


rule fig6_samples:
    """Fig. 6: the same prompts sampled by the base policy and every variant of the ladder (seed 0)."""
    input:
        expand(f"{RUNS}/samples/{{run}}/samples", run=base_runs() + ladder_runs()),
    output:
        report(
            expand(f"{REPORT}/fig6_samples.{{ext}}", ext=config["report"]["formats"]),
            caption="../report/fig6_samples.rst",
            category=CATEGORY_LADDER,
            subcategory="figures",
        ),
    params:
        runs=json.dumps({"base": base_runs(), "runs": ladder_runs(), "prompts": config["report"]["grid_prompts"]}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/fig6_samples.log",
    benchmark:
        f"timings/{NAME}/report/fig6_samples.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("samples")


rule artifacts:
    """Fig. 6's background artifacts, measured per method and paired by image (is the grid GRPO's alone?)."""
    input:
        samples=expand(f"{RUNS}/samples/{{run}}/samples", run=base_runs() + ladder_runs()),
        world=f"{DATA}/world.json",
    output:
        report(f"{REPORT}/artifacts.csv", caption="../report/artifacts.rst", category=CATEGORY_LADDER, subcategory="tables"),
        f"{REPORT}/artifacts.md",
    params:
        runs=lambda wc, input: json.dumps({"base": base_runs(), "runs": ladder_runs(), "world": input.world}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/artifacts.log",
    benchmark:
        f"timings/{NAME}/report/artifacts.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("artifacts")


rule fig7a_samples:
    """Fig. 7a: sample grid per masking ratio k and threshold tau."""
    input:
        expand(f"{RUNS}/samples/{{run}}/samples", run=ablation_runs()),
    output:
        report(
            expand(f"{REPORT}/fig7a_samples.{{ext}}", ext=config["report"]["formats"]),
            caption="../report/fig7a_samples.rst",
            category=CATEGORY_ABLATIONS,
            subcategory="figures",
        ),
    params:
        runs=json.dumps({"runs": ablation_runs(), "prompts": config["report"]["grid_prompts"]}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/fig7a_samples.log",
    benchmark:
        f"timings/{NAME}/report/fig7a_samples.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("ablation-samples")


rule fig7b_reward_curves:
    """Fig. 7b: training reward curves per masking ratio k."""
    input:
        expand(f"{RUNS}/{{run}}/metrics.csv", run=ablation_runs()),
    output:
        report(
            expand(f"{REPORT}/fig7b_reward_curves.{{ext}}", ext=config["report"]["formats"]),
            caption="../report/fig7b_reward_curves.rst",
            category=CATEGORY_ABLATIONS,
            subcategory="figures",
        ),
    params:
        runs=json.dumps({"runs": ablation_runs()}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/fig7b_reward_curves.log",
    benchmark:
        f"timings/{NAME}/report/fig7b_reward_curves.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("ablation-curves")


rule fig7c_final_metric:
    """Fig. 7c: final evaluation metric against k, tau and S."""
    input:
        get_eval_outputs(ablation_runs() + [f"base/{EXP['ablations']['policy']}"]),
    output:
        report(
            expand(f"{REPORT}/fig7c_final_metric.{{ext}}", ext=config["report"]["formats"]),
            caption="../report/fig7c_final_metric.rst",
            category=CATEGORY_ABLATIONS,
            subcategory="figures",
        ),
    params:
        runs=json.dumps({"runs": ablation_runs(), "base": f"base/{EXP['ablations']['policy']}"}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/fig7c_final_metric.log",
    benchmark:
        f"timings/{NAME}/report/fig7c_final_metric.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("ablation-final")


rule estimators:
    """Each estimator's noise, signal and cost at the base (report/estimators.*, fig_estimators.*)."""
    input:
        estimator_outputs(),
    output:
        report(f"{REPORT}/estimators.csv", caption="../report/estimators.rst", category=CATEGORY_LADDER, subcategory="tables"),
        f"{REPORT}/estimators.md",
        report(
            expand(f"{REPORT}/fig_estimators.{{ext}}", ext=config["report"]["formats"]),
            caption="../report/estimators.rst",
            category=CATEGORY_LADDER,
            subcategory="figures",
        ),
    params:
        runs=json.dumps({"blocks": [estimator_block()]}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/estimators.log",
    benchmark:
        f"timings/{NAME}/report/estimators.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("estimators")


rule checkpoint_gradients:
    """Claim b along training: the AR batch gradient's noise and norm at the ladder's checkpoints, +Fix against GRPO
    (report/checkpoint_gradients.*, fig_checkpoint_gradients.*)."""
    input:
        checkpoint_outputs(),
        estimator_outputs(),
    output:
        report(
            f"{REPORT}/checkpoint_gradients.csv",
            caption="../report/checkpoint_gradients.rst",
            category=CATEGORY_LADDER,
            subcategory="tables",
        ),
        f"{REPORT}/checkpoint_gradients_ratios.csv",
        f"{REPORT}/checkpoint_gradients.md",
        report(
            expand(f"{REPORT}/fig_checkpoint_gradients.{{ext}}", ext=config["report"]["formats"]),
            caption="../report/checkpoint_gradients.rst",
            category=CATEGORY_LADDER,
            subcategory="figures",
        ),
    params:
        runs=json.dumps({"blocks": [estimator_block()]}),
        prefix=lambda wc, output: report_prefix(output),
        **REPORT_PARAMS,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/report/checkpoint_gradients.log",
    benchmark:
        f"timings/{NAME}/report/checkpoint_gradients.tsv"
    resources:
        **SITE,
    shell:
        report_cmd("checkpoint-gradients")
