# The toy's shipped stages (toy_weights: shipped): each folder the release holds for this config's settings and code
# is copied into results/ after its checksums are checked, where the training rule would have written it. The
# training rules stay for every other folder (ruleorder); `make toy-weights` trains them all and packs the release.


if TOYCLIP in SHIPPED:

    rule place_toyclip:
        """toyclip from the toy's release (margrpo place-weights)."""
        output:
            model=directory(f"{TOYCLIP}/model"),
            metrics=f"{TOYCLIP}/metrics.json",
        params:
            folder=lambda wc, output: os.path.dirname(output.metrics),
            release=TOY_RELEASE,
        conda:
            "../../envs/margrpo.yaml"
        log:
            f"logs/place_weights/{os.path.basename(TOYCLIP)}.log",
        benchmark:
            f"timings/place_weights/{os.path.basename(TOYCLIP)}.tsv"
        shell:
            "margrpo place-weights --folder {params.folder:q} --release {params.release:q} > {log:q} 2>&1"

    ruleorder: place_toyclip > train_toyclip
    localrules: place_toyclip  # a copy: no cluster job


if TOYPREF in SHIPPED:

    rule place_toypref:
        """toypref from the toy's release (margrpo place-weights)."""
        output:
            model=directory(f"{TOYPREF}/model"),
            metrics=f"{TOYPREF}/metrics.json",
        params:
            folder=lambda wc, output: os.path.dirname(output.metrics),
            release=TOY_RELEASE,
        conda:
            "../../envs/margrpo.yaml"
        log:
            f"logs/place_weights/{os.path.basename(TOYPREF)}.log",
        benchmark:
            f"timings/place_weights/{os.path.basename(TOYPREF)}.tsv"
        shell:
            "margrpo place-weights --folder {params.folder:q} --release {params.release:q} > {log:q} 2>&1"

    ruleorder: place_toypref > train_toypref
    localrules: place_toypref


SHIPPED_BASES = [os.path.basename(d) for d in SHIPPED if os.path.basename(os.path.dirname(d)) == "pretrain"]
if SHIPPED_BASES:

    rule place_pretrained:
        """A toy base policy from the toy's release (margrpo place-weights): its pre-training, not its warm-up."""
        output:
            policy=directory(f"{RESULTS}/pretrain/{{pretrained}}/policy"),
            quality=f"{RESULTS}/pretrain/{{pretrained}}/quality.json",
            samples=f"{RESULTS}/pretrain/{{pretrained}}/samples.png",
        wildcard_constraints:
            pretrained="|".join(re.escape(name) for name in SHIPPED_BASES),
        params:
            folder=lambda wc, output: os.path.dirname(output.quality),
            release=TOY_RELEASE,
        conda:
            "../../envs/margrpo.yaml"
        log:
            "logs/place_weights/{pretrained}.log",
        benchmark:
            "timings/place_weights/{pretrained}.tsv"
        shell:
            "margrpo place-weights --folder {params.folder:q} --release {params.release:q} > {log:q} 2>&1"

    ruleorder: place_pretrained > pretrain
    localrules: place_pretrained


rule trained_toy_stages:
    """Every shared toy stage of this config: `make toy-weights` builds it (toy_weights=train), then packs it; the
    warm-ups' quality too, which a Harmon-like base's quality bar reads (margrpo.evaluation.competence)."""
    input:
        [f"{d}/{'policy' if s['stage'] == 'pretrain' else 'model'}" for d, s in toy_stages(config, RESULTS).items()],
        [f"{d}/quality.json" for d in shared_dirs(config, RESULTS)["warmup"].values()],
