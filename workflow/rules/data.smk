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
        f"benchmarks/make_suites/{os.path.basename(DATA)}.tsv"
    shell:
        "margrpo make-suites --out-dir {params.out_dir} --seed {params.prompts[seed]}"
        " --n-train {params.prompts[n_train]} --n-val {params.prompts[n_val]} --n-eval {params.prompts[n_eval]}"
        " {params.world} > {log} 2>&1"
