rule make_suites:
    """Disjoint RL-training / validation / evaluation prompt suites (JSONL: prompt, category, spec)."""
    output:
        get_suites(),
        world=f"{DATA}/world.json",
    params:
        world=lambda wc: suite_source_args(),
        prompts=config["prompts"],
        out_dir=lambda wc, output: os.path.dirname(output.world),
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/make_suites/{os.path.basename(DATA)}.log",
    benchmark:
        f"timings/make_suites/{os.path.basename(DATA)}.tsv"
    resources:
        **SITE,
    shell:
        "margrpo make-suites --out-dir {params.out_dir:q} --seed {params.prompts[seed]:q}"
        " --n-train {params.prompts[n_train]:q} --n-val {params.prompts[n_val]:q} --n-eval {params.prompts[n_eval]:q}"
        " {params.world} > {log:q} 2>&1"
