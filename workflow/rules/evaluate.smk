rule sample:
    """Images of the evaluation suite in the T2I-CompBench layout: samples/{prompt}_{index:06d}.png."""
    input:
        policy=get_sample_policy,
        suite=f"{DATA}/eval.jsonl",
    output:
        directory(f"{RUNS}/samples/{{run}}/samples"),
    params:
        n=config["evaluation"]["images_per_prompt"],
        max_prompts=config["evaluation"]["max_prompts"] or 0,
        batch=config["evaluation"]["batch_size"],
        sampling=get_sampling_json,
        precision=config["mixed_precision"],
    threads: config["threads"]
    resources:
        gpu=GPU,
        **slurm("sample"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/sample/{{run}}.log",
    benchmark:
        f"timings/{NAME}/sample/{{run}}.tsv"
    shell:
        "margrpo sample --policy {input.policy:q} --suite {input.suite:q} --sampling-json {params.sampling:q}"
        " --images-per-prompt {params.n:q} --max-prompts {params.max_prompts:q} --batch-size {params.batch:q}"
        " --precision {params.precision:q} --out-dir {output:q} --seed 1234 --threads {threads:q} > {log:q} 2>&1"


rule eval_compbench:
    """CompBench-style per-category scores (the ShapesWorld parser on the toy world; T2I-CompBench's metrics at real scale)."""
    input:
        samples=f"{RUNS}/samples/{{run}}/samples",
        suite=f"{DATA}/eval.jsonl",
    output:
        per_category=f"{RUNS}/eval/{{run}}/compbench.csv",
        per_image=f"{RUNS}/eval/{{run}}/compbench_per_image.csv",
    params:
        n=config["evaluation"]["images_per_prompt"],
        max_prompts=config["evaluation"]["max_prompts"] or 0,
        evaluator=config["evaluation"]["compbench"],
        models=json.dumps(config["evaluation"]["compbench_models"]),
    resources:
        gpu=GPU if config["evaluation"]["compbench"] == "t2i-compbench" else 0,
        **slurm("eval_compbench"),
    conda:
        "../../envs/margrpo.yaml"
    log:
        f"logs/{NAME}/eval_compbench/{{run}}.log",
    benchmark:
        f"timings/{NAME}/eval_compbench/{{run}}.tsv"
    shell:
        "margrpo eval-compbench --samples-dir {input.samples:q} --suite {input.suite:q}"
        " --images-per-prompt {params.n:q} --max-prompts {params.max_prompts:q} --evaluator {params.evaluator:q} --models-json {params.models:q}"
        " --out-per-image {output.per_image:q} --out-per-category {output.per_category:q} > {log:q} 2>&1"


rule eval_preference:
    """Preference-model scores (toyclip on the toy world; HPS/ImageReward/PickScore at real scale)."""
    input:
        samples=f"{RUNS}/samples/{{run}}/samples",
        suite=f"{DATA}/eval.jsonl",
        rewards=get_reward_inputs,
    output:
        f"{RUNS}/eval/{{run}}/preference.csv",
    params:
        n=config["evaluation"]["images_per_prompt"],
        max_prompts=config["evaluation"]["max_prompts"] or 0,
        scorers=",".join(config["evaluation"]["preference"]),
        options=json.dumps(config["reward_models"]),
        toyclip=f"{TOYCLIP}/model",
        toypref=f"{TOYPREF}/model",
    threads: config["threads"]
    resources:
        gpu=GPU,
        **slurm("eval_preference"),
    conda:
        "../../envs/evaluators.yaml"
    log:
        f"logs/{NAME}/eval_preference/{{run}}.log",
    benchmark:
        f"timings/{NAME}/eval_preference/{{run}}.tsv"
    shell:
        "margrpo eval-preference --samples-dir {input.samples:q} --suite {input.suite:q} --scorers {params.scorers:q}"
        " --images-per-prompt {params.n:q} --max-prompts {params.max_prompts:q}"
        " --options-json {params.options:q} --toyclip-dir {params.toyclip:q} --toypref-dir {params.toypref:q} --out {output:q} > {log:q} 2>&1"
