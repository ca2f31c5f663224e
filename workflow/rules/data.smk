rule make_suites:
    """Disjoint RL-training / validation / evaluation prompt suites (JSONL: prompt, category, spec)."""
    output:
        get_suites(),
        world=f"{RESULTS}/data/suites/world.json",
    params:
        world=lambda wc: suite_source_args(),
        prompts=config["prompts"],
        out_dir=lambda wc, output: os.path.dirname(output.world),
    conda:
        "../../envs/margrpo.yaml"
    log:
        "logs/make_suites/make_suites.log",
    benchmark:
        "benchmarks/make_suites/make_suites.tsv"
    shell:
        "margrpo make-suites --out-dir {params.out_dir} --seed {params.prompts[seed]}"
        " --n-train {params.prompts[n_train]} --n-val {params.prompts[n_val]} --n-eval {params.prompts[n_eval]}"
        " {params.world} > {log} 2>&1"
