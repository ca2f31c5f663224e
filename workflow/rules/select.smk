rule select_checkpoint:
    """Baselines report their best checkpoint by validation reward (*); the method a step fixed in advance."""
    input:
        get_selection_input,
    output:
        f"{RUNS}/select/{{run}}/selection.json",
    params:
        step=get_report_step,
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/select_checkpoint/{{run}}.log",
    benchmark:
        f"timings/{NAME}/select_checkpoint/{{run}}.tsv"
    resources:
        **SITE,
    shell:
        "margrpo select --summary {input:q} --step {params.step:q} --out {output:q} > {log:q} 2>&1"
