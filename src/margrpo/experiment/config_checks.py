"""The checks `margrpo.experiment.config.validate_config` runs after the schema, and the check of the config
files a `make run` / `make report` command line names, before Snakemake renders them.

Across fields: names used are defined, the toy scorers a reward names are trained, every variant makes a
trainable run for the process count and each policy's sampling (`check_grpo_run`, which `margrpo train` runs on
its spec too), settings that pass the schema one by one but would run wrong, the ablation grid. The world a
config describes must build, and its suites must fit in it (`check_world`); Table 3's related entries are read
into the dataclasses of the stages that take them (`check_related`). Errors name the key path.
"""

from __future__ import annotations

import csv
from pathlib import Path

from margrpo.experiment.schema import (
    ConfigError,
    check_defined,
    check_finite,
    check_schema,
    read_config_file,
    schema_section,
)
from margrpo.experiment.specs import grpo_settings
from margrpo.infra.files import InputError

ABLATION_COLUMNS = {"top_frac": float, "tau": float, "trajectories": int}  # variant switches a grid may vary


def world_config(world: dict):
    """The WorldConfig `make-suites` builds from the config's `world` section (the toy32 preset and these knobs)."""
    from margrpo.world.config import PRESETS, world_from_knobs

    return world_from_knobs(PRESETS["toy32"], world)


def world_capacity(cfg) -> dict[str, int]:
    """Per category, an upper bound on the distinct prompts (canonical specs) the world's captions can make: the
    sets of at most max_objects phrases over the attributes each category names (margrpo.world.captions), and for
    the relations, ordered pairs in 3 canonical directions. A suite asking for more can never be drawn."""
    from math import comb

    P, S, T, m = len(cfg.palette), len(cfg.shapes), len(cfg.textures), cfg.max_objects

    # multisets of at most m phrases of n kinds: bounds every phrase list
    def sets(n):
        return comb(n + m, m)

    return {
        "color": sets(P * S),
        "shape": sets((P + 1) * S),
        "texture": sets((P + 1) * S * T),
        "spatial": 3 * ((P + 1) * S) ** 2,
        "numeracy": sets(S) * (P + 1) ** S,
        "complex": sets(P * S * T) + 3 * (P * S * (T + 1)) ** 2 + sets(P * S),
    }


def check_world(config: dict, source: str) -> None:
    """The ShapesWorld knobs must build a world, and the suites' sizes fit in it (make-suites would search for
    prompts that do not exist, then fail)."""
    p = config["prompts"]
    if p["source"] != "shapesworld":
        return
    from margrpo.world.config import CATEGORIES

    try:
        cfg = world_config(config["world"])
    except ValueError as err:
        raise ConfigError(f"{source}: key 'world': {err}") from None
    capacity, used = world_capacity(cfg), dict.fromkeys(CATEGORIES, 0)
    for split in ("eval", "val", "train"):  # make-suites' order: each split avoids the prompts of those before it
        base, rest = divmod(p[f"n_{split}"], len(CATEGORIES))
        for i, category in enumerate(CATEGORIES):
            used[category] += base + (i < rest)
            if used[category] > capacity[category]:
                raise ConfigError(
                    f"{source}: key 'prompts.n_{split}': {p[f'n_{split}']} prompts ask for {used[category]} distinct "
                    f"{category} prompts (with the splits drawn before it), but this world (world.palette_size "
                    f"{len(cfg.palette)}, max_objects {cfg.max_objects}) has at most {capacity[category]}"
                )


def check_related(config: dict, source: str) -> None:
    """Table 3's policy and method entries, read as their stages read them (unknown keys, bad values)."""
    related = config["experiments"]["related"]
    if not related["enabled"]:
        return
    from margrpo.infra.readers import dataclass_from
    from margrpo.related.marval import MARVALConfig, MARVALRLConfig
    from margrpo.related.maskgrpo.policy import ToyMaskConfig
    from margrpo.related.maskgrpo.pretraining import MaskPretrainConfig
    from margrpo.related.maskgrpo.rollout import MaskSamplingConfig
    from margrpo.related.maskgrpo.trainer import MaskGRPOConfig
    from margrpo.world import prompt_vocabulary

    def read(cls, section: str, fixed: dict | None = None):
        node = related
        for part in section.split("."):
            node = node[part]
        try:
            dataclass_from(cls, node, f"{source}: key 'experiments.related.{section}'", fixed)
        except InputError as err:
            raise ConfigError(str(err)) from None

    world = world_config(config["world"]).to_dict() if config["prompts"]["source"] == "shapesworld" else None
    read(ToyMaskConfig, "mask.model", {"world": world, "vocab": prompt_vocabulary()} if world else {"vocab": []})
    read(MaskPretrainConfig, "mask.pretrain")
    read(MaskSamplingConfig, "mask.sampling")
    read(MARVALConfig, "marval.distill")
    check_schema(
        schema_section("policies.*.sampling"),
        related["marval"]["sampling"],
        source,
        fill=False,
        at="experiments.related.marval.sampling",
    )
    for method in ("grpo-mask", "maskgrpo"):
        read(MaskGRPOConfig, f"settings.{method}", {"method": "grpo" if method == "grpo-mask" else "mask_grpo"})
    read(MARVALRLConfig, "settings.marval-rl", {"toyclip_weight": 1.0, "shapes_weight": 0.0})
    check_schema(
        schema_section("grpo"),
        related["settings"]["grpo-onestep"],
        source,
        fill=False,
        at="experiments.related.settings.grpo-onestep",
    )


# --- across fields: names, scorers, variants, settings, the ablation grid ------------------------------------------
ESTIMATOR_VARIANTS = {"every_step": "fix", "pathwise": "fix"}  # the others are the variants of their names
DIFFERENTIABLE_REWARDS = ("toypref", "toyclip")


def check_estimators(config: dict, source: str) -> None:
    """The estimators' stage: a toy policy, a reward of differentiable scorers, the variants it is built on."""
    e = config["experiments"]["estimators"]
    if not e["enabled"]:
        return
    check_defined(config, "policies", [e["policy"]], "experiments.estimators.policy", source)
    check_defined(config, "rewards", [e["reward"]], "experiments.estimators.reward", source)
    variants = sorted({ESTIMATOR_VARIANTS.get(n, n) for n in e["estimators"]})
    check_defined(config, "variants", variants, "experiments.estimators.estimators", source)
    if config["policies"][e["policy"]]["kind"] != "toy":
        raise ConfigError(
            f"{source}: key 'experiments.estimators.policy': the estimators' stage holds every batch gradient in "
            f"memory and differentiates through the sampler: a toy policy, not {e['policy']!r}"
        )
    if bad := sorted(set(config["rewards"][e["reward"]]) - set(DIFFERENTIABLE_REWARDS)):
        raise ConfigError(
            f"{source}: key 'experiments.estimators.reward': {e['reward']!r} has scorers {bad} that are not "
            f"differentiable; the exact gradient needs {' / '.join(DIFFERENTIABLE_REWARDS)} alone"
        )
    if e["exact_parts"] % 2 or e["exact_images"] % (4 * e["exact_parts"]):
        raise ConfigError(
            f"{source}: key 'experiments.estimators.exact_images': {e['exact_images']} images in "
            f"{e['exact_parts']} parts: the parts must be even in number, each a multiple of 4 images"
        )
    check_checkpoint_gradients(config, source)


def check_checkpoint_gradients(config: dict, source: str) -> None:
    """The instrument at trained checkpoints: ladder runs of the estimators' base and reward, checkpoints they save,
    and the base's +Fix batches as its step 0 (the same batch seeds)."""
    e, ladder = config["experiments"]["estimators"], config["experiments"]["ladder"]
    c = e["checkpoints"]
    if not c["variants"]:
        return
    key = "experiments.estimators.checkpoints"
    if missing := [v for v in c["variants"] if v not in ladder["variants"]]:
        raise ConfigError(f"{source}: key '{key}.variants': {missing} are not ladder variants (experiments.ladder)")
    if e["policy"] not in ladder["policies"] or e["reward"] not in ladder["rewards"]:
        raise ConfigError(
            f"{source}: key '{key}': the ladder trains no runs of {e['policy']!r} on {e['reward']!r} "
            "(experiments.estimators.policy / reward) whose checkpoints it could measure"
        )
    if "fix" not in e["estimators"] or c["batches"] > e["batches"]:
        raise ConfigError(
            f"{source}: key '{key}.batches': step 0 is the base's +Fix batches, so experiments.estimators.estimators "
            f"needs fix and at least {c['batches']} batches (has {e['estimators']}, {e['batches']})"
        )
    for variant in c["variants"]:
        grpo = grpo_settings(config, e["policy"], variant)
        if not all(isinstance(grpo[k], int) and grpo[k] > 0 for k in ("steps", "save_every")):
            continue  # a bad override: the overrides' own check names it
        # the steps grpo.run_loop.Cadence.saves writes (not imported: the grpo package imports torch, and the config
        # checks run before every Snakemake start)
        saved = {s for s in range(grpo["save_every"], grpo["steps"] + 1, grpo["save_every"])} | {grpo["steps"]}
        if bad := sorted(set(c["steps"]) - saved):
            raise ConfigError(
                f"{source}: key '{key}.steps': {variant!r} saves no checkpoint at steps {bad} (grpo.steps "
                f"{grpo['steps']}, save_every {grpo['save_every']})"
            )


def check_climb(config: dict, source: str) -> None:
    """The climbing ladder: defined names, a control that shuffles its advantages in every block, and blocks of its
    own (a (policy, reward) of the ladder's too would mix two ladders' runs in one block of the reports)."""
    climb, ladder = config["experiments"]["climb"], config["experiments"]["ladder"]
    if not climb["enabled"]:
        return
    for kind in ("policies", "rewards", "variants"):
        check_defined(config, kind, climb[kind], f"experiments.climb.{kind}", source)
    if climb["control"] not in climb["variants"]:
        raise ConfigError(
            f"{source}: key 'experiments.climb.control': {climb['control']!r} is not one of "
            f"experiments.climb.variants {climb['variants']}"
        )
    for policy in climb["policies"]:
        if grpo_settings(config, policy, climb["control"])["advantages"] != "shuffled":
            raise ConfigError(
                f"{source}: key 'experiments.climb.control': variant {climb['control']!r} trains {policy!r} with its "
                "advantages as they are; the control sets overrides: {advantages: shuffled}"
            )
    shared = {(p, r) for p in climb["policies"] for r in climb["rewards"]} & {
        (p, r) for p in ladder["policies"] for r in ladder["rewards"]
    }
    if shared:
        raise ConfigError(
            f"{source}: key 'experiments.climb': {sorted(shared)} are also the ladder's (experiments.ladder); "
            "the climbing ladder needs a policy or reward of its own"
        )


def check_references(config: dict, source: str) -> None:
    """Names used in `experiments` must be defined in `policies`, `rewards` and `variants`."""

    def need(kind: str, names, where: str):
        check_defined(config, kind, names, where, source)

    exp = config["experiments"]
    for table in ("ladder", "table1"):
        need("policies", exp[table]["policies"], f"experiments.{table}.policies")
        need("rewards", exp[table]["rewards"], f"experiments.{table}.rewards")
    need("variants", exp["ladder"]["variants"], "experiments.ladder.variants")
    if both := sorted(set(exp["ladder"]["seeds"]) & set(exp["ladder"]["replicate_seeds"])):
        raise ConfigError(
            f"{source}: key 'experiments.ladder.replicate_seeds': {both} also in experiments.ladder.seeds; "
            "the second seed set must be other seeds"
        )
    if extra := sorted(set(exp["ladder"]["replicate_variants"] or []) - set(exp["ladder"]["variants"])):
        raise ConfigError(
            f"{source}: key 'experiments.ladder.replicate_variants': {extra} not in experiments.ladder.variants; "
            "the second seed set trains some of the ladder's variants again"
        )
    need("variants", [exp["table1"]["baseline"], exp["table1"]["ours"]], "experiments.table1")
    check_climb(config, source)
    if exp["ablations"]["enabled"]:
        need("policies", [exp["ablations"]["policy"]], "experiments.ablations.policy")
        need("rewards", [exp["ablations"]["reward"]], "experiments.ablations.reward")
        need("variants", [exp["ablations"]["variant"]], "experiments.ablations.variant")
    check_estimators(config, source)
    related = exp["related"]
    if related["enabled"]:
        need("rewards", [related["reward"]], "experiments.related.reward")
        need("policies", [related["mar_grpo"]["policy"], related["marval"]["teacher"]], "experiments.related")
        need("variants", [related["mar_grpo"]["variant"]], "experiments.related.mar_grpo.variant")
        teacher = config["policies"][related["marval"]["teacher"]]
        if teacher["kind"] != "toy" or teacher["head"] != "flow":
            raise ConfigError(
                f"{source}: key 'experiments.related.marval.teacher': MARVAL distils a toy policy with a flow head "
                f"(toy-nova), not a {teacher['kind']} / {teacher.get('head')} one"
            )
    for name, policy in config["policies"].items():
        if policy["kind"] != "toy" and not policy.get("path"):
            raise ConfigError(
                f"{source}: key 'policies.{name}.path': a {policy['kind']} policy loads from a local folder; "
                "set its path"
            )
    _check_scorers(config, source)


def _check_scorers(config: dict, source: str) -> None:
    """The toy scorers a reward or the preference evaluation names must be trained: enabled, and toypref's
    own needs met (toyclip to fine-tune from, backdrops that differ in brightness)."""
    for scorer in ("toyclip", "toypref"):  # the scorers the pipeline trains
        for setting, weights in config["rewards"].items():
            if scorer in weights and not config[scorer]["enabled"]:
                raise ConfigError(
                    f"{source}: key 'rewards.{setting}.{scorer}': the {scorer} scorer is disabled "
                    f"({scorer}.enabled: false)"
                )
        if scorer in config["evaluation"]["preference"] and not config[scorer]["enabled"]:
            raise ConfigError(
                f"{source}: key 'evaluation.preference': the {scorer} scorer is disabled ({scorer}.enabled: false)"
            )
    if names_scorer(config, "toypref") and not config["toyclip"]["enabled"]:
        raise ConfigError(
            f"{source}: key 'toyclip.enabled': toypref (named by a reward or evaluation.preference) is "
            "fine-tuned from toyclip, which is disabled"
        )
    if (
        names_scorer(config, "toypref")
        and config["prompts"]["source"] == "shapesworld"
        and config["world"]["backdrop_max"] < 0.04
    ):
        raise ConfigError(
            f"{source}: key 'world.backdrop_max': toypref prefers the brighter of two backdrops, and "
            f"{config['world']['backdrop_max']} leaves no range to prefer in (>= 0.04), or set toypref.enabled: false"
        )


def names_scorer(config: dict, scorer: str) -> bool:
    """Does a reward setting or the preference evaluation use `scorer`? (The workflow trains toypref only then.)"""
    return any(scorer in w for w in config["rewards"].values()) or scorer in config["evaluation"]["preference"]


def check_variants(config: dict, source: str) -> None:
    """Each variant's effective GRPO settings on each policy (grpo + the policy's + the variant's overrides) must
    make a trainable run."""
    for pname, policy in config["policies"].items():  # no defaults: each is a delta on the one before
        check_schema(schema_section("grpo"), policy.get("grpo") or {}, source, fill=False, at=f"policies.{pname}.grpo")
    for name, variant in config["variants"].items():
        check_schema(schema_section("grpo"), variant["overrides"], source, fill=False, at=f"variants.{name}.overrides")
    for pname, policy in config["policies"].items():
        for name in config["variants"]:
            check_grpo_run(
                grpo_settings(config, pname, name),
                {f"policies.{pname}.sampling": policy["sampling"]},
                config["train_processes"] * config["train_nodes"],
                source,
                _variant_key(config, pname, name),
                f" in variant {name!r} of policy {pname!r}",
            )


def _variant_key(config: dict, policy: str, name: str):
    """The key path of a GRPO setting as variant `name` runs it on `policy`: the variant's override if it has one,
    else the policy's, else grpo's."""
    overrides, own = config["variants"][name]["overrides"], config["policies"][policy].get("grpo") or {}

    def key(k: str) -> str:
        return (
            f"variants.{name}.overrides.{k}"
            if k in overrides
            else f"policies.{policy}.grpo.{k}"
            if k in own
            else f"grpo.{k}"
        )

    return key


def check_grpo_run(g: dict, samplings: dict[str, dict], procs: int, source: str, key, context: str = "") -> None:
    """A run's GRPO settings against its process count and the sampling of each policy it may train (`samplings`:
    {key path: sampling}). One check for the dry run (every variant x policy) and `margrpo train` (its spec)."""
    if g["batch_prompts"] % procs:
        raise ConfigError(
            f"{source}: key '{key('batch_prompts')}': {g['batch_prompts']} prompt groups do not split evenly "
            f"over the {procs} processes (train_processes x train_nodes; each process rolls out whole groups){context}"
        )
    images = g["batch_prompts"] * g["group_size"] // procs
    if images % g["micro_batches"]:
        raise ConfigError(
            f"{source}: key '{key('micro_batches')}': {g['micro_batches']} micro-batches do not divide the "
            f"{images} images of a process's batch "
            f"(batch_prompts x group_size / (train_processes x train_nodes)){context}"
        )
    for where, s in samplings.items():
        if g["mask_steps"] > s["ar_steps"]:
            raise ConfigError(
                f"{source}: key '{key('mask_steps')}': |M| = {g['mask_steps']} exceeds "
                f"{where}.ar_steps = {s['ar_steps']}"
            )
        stochastic = s["diffusion_steps"] - (0 if s["final_step_noise"] else 1)
        if g["diffusion_steps"] > stochastic:
            raise ConfigError(
                f"{source}: key '{key('diffusion_steps')}': |T| = {g['diffusion_steps']} exceeds the {stochastic} "
                f"stochastic steps of {where}.diffusion_steps"
            )


def check_val_prompts(
    val_prompts: int, val_size: int, val_from: str, source: str, key: str, context: str = ""
) -> None:
    """Validation takes the first `val_prompts` of the validation suite: more than it holds would validate on fewer."""
    if val_prompts > val_size:
        raise ConfigError(
            f"{source}: key '{key}': {val_prompts} exceeds the {val_size} prompts of the validation suite "
            f"({val_from}){context}"
        )


def check_settings(config: dict, source: str) -> None:
    """Settings that pass the schema one by one but would run wrong or fail late (issue 27)."""

    def fail(key: str, why: str):
        raise ConfigError(f"{source}: key '{key}': {why}")

    p, defaults = config["prompts"], schema_section("prompts")["properties"]

    def default(k: str):
        return defaults[k]["default"]

    if p["source"] == "files" and p["n_train"] != default("n_train"):
        fail("prompts.n_train", "the files source trains on every prompt of prompts.train_file; remove n_train")
    if p["source"] == "files" and p["val_file"] and p["n_val"] != default("n_val"):
        fail("prompts.n_val", "prompts.val_file gives the validation prompts; remove n_val")
    val_size, val_from = _val_suite_size(config)
    for (pname, name), variant in [((p, n), v) for p in config["policies"] for n, v in config["variants"].items()]:
        g = grpo_settings(config, pname, name)
        key = _variant_key(config, pname, name)
        if val_size is not None:
            check_val_prompts(
                g["val_prompts"], val_size, val_from, source, key("val_prompts"), f" in variant {name!r}"
            )
        step = variant["report_step"]
        if isinstance(step, int) and step > g["steps"]:
            fail(
                f"variants.{name}.report_step",
                f"step {step} is past the run's last step ({key('steps')} = {g['steps']})",
            )
        if isinstance(step, int) and step % g["save_every"] and step != g["steps"]:
            fail(
                f"variants.{name}.report_step",
                f"no checkpoint at step {step}: checkpoints are saved every {key('save_every')} = "
                f"{g['save_every']} steps and at the last",
            )
    for setting, weights in config["rewards"].items():
        if not any(weights.values()):
            fail(f"rewards.{setting}", "every weight is zero: the reward would be the same for every image")
    for name, policy in config["policies"].items():
        if policy["kind"] != "toy":
            # nova / harmon token grids and parameter names come from their weights: checked when training starts
            continue
        size, patch = config["world"]["image_size"], policy["model"]["patch_size"]
        if size % patch:
            fail(f"policies.{name}.model.patch_size", f"{patch} px does not divide world.image_size = {size} px")
        if policy["sampling"]["ar_steps"] > (size // patch) ** 2:
            fail(
                f"policies.{name}.sampling.ar_steps",
                f"K = {policy['sampling']['ar_steps']} exceeds the {(size // patch) ** 2} tokens "
                f"of a {size} px image in {patch} px patches",
            )
        _check_toy_names(name, policy, size, fail)


def _val_suite_size(config: dict) -> tuple[int | None, str]:
    """How many prompts `make-suites` puts in val.jsonl, and from where (None when the file is not there yet)."""
    p = config["prompts"]
    if p["source"] == "files" and p["val_file"]:
        if not Path(p["val_file"]).is_file():
            return None, ""
        from margrpo.prompts.files import read_prompt_file

        return len(read_prompt_file(p["val_file"], "object")), f"prompts.val_file {p['val_file']}"
    return p["n_val"], "prompts.n_val"


def _check_toy_names(name: str, policy: dict, image_size: int, fail) -> None:
    """A toy policy's rl_frozen prefixes and LoRA target_modules must each name something; its parameter
    names follow from the config (the model built on the meta device: no weights, no time)."""
    lora = policy["lora"] or {}
    if not (policy["rl_frozen"] or lora.get("target_modules")):
        return  # no torch import for the common case
    import torch

    from margrpo.policy.lora import lora_leaves
    from margrpo.policy.toy import ToyMAR, ToyMARConfig

    with torch.device("meta"):
        model = ToyMAR(ToyMARConfig(head_type=policy["head"], image_size=image_size, vocab=["a"], **policy["model"]))
    names = [n for n, _ in model.named_parameters()]
    for i, prefix in enumerate(policy["rl_frozen"]):
        if not any(n.startswith(prefix) for n in names):
            fail(
                f"policies.{name}.rl_frozen.{i}",
                f"no parameter name of the toy policy starts with {prefix!r} "
                f"(top-level modules: {', '.join(sorted({n.split('.')[0] for n in names}))})",
            )
    leaves = lora_leaves(model)
    for i, target in enumerate(lora.get("target_modules") or []):
        if not any(leaf == target or leaf.endswith("." + target) for leaf in leaves):
            fail(
                f"policies.{name}.lora.target_modules.{i}",
                f"{target!r} names no Linear layer in the toy policy's blocks (they are {', '.join(sorted(leaves))})",
            )


def resolve_path(path: str | Path, root: Path) -> Path | None:
    """A config path relative to the working directory, else to `root`; None if in neither."""
    for candidate in (Path(path), root / path):
        if candidate.is_file():
            return candidate
    return None


def check_ablations(config: dict, source: str, root: Path) -> None:
    """The Fig. 7 grid: a TSV whose columns are variant switches and whose rows are valid, distinct values."""
    a = config["experiments"]["ablations"]
    if not a["enabled"]:
        return
    where = f"{source}: key 'experiments.ablations.table'"
    path = resolve_path(a["table"], root)
    if path is None:
        raise ConfigError(f"{where}: {a['table']} not found (relative to the working directory or {root})")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    header, rows = (rows[0], rows[1:]) if rows else ([], [])
    unknown = [c for c in header if c not in ABLATION_COLUMNS]
    if not header or unknown or len(set(header)) < len(header):
        raise ConfigError(
            f"{where}: {path} has columns {header}; expected distinct columns from {sorted(ABLATION_COLUMNS)} "
            f"(unknown: {unknown})"
        )
    if not rows:
        raise ConfigError(f"{where}: {path} has no grid points")
    schema = schema_section("variants.*")
    seen = {}
    for line, row in enumerate(rows, start=2):
        try:
            if len(row) != len(header):
                raise ValueError(f"{len(row)} fields for {len(header)} columns")
            values = {c: ABLATION_COLUMNS[c](v) for c, v in zip(header, row)}
        except ValueError as err:
            raise ConfigError(f"{where}: {path}:{line}: {err}") from None
        check_finite(values, f"{where}: {path}:{line}")
        check_schema(schema, values, f"{where}: {path}:{line}", fill=False)  # ranges of top_frac, trajectories
        if tuple(values.values()) in seen:
            raise ConfigError(f"{where}: {path}:{line} repeats line {seen[tuple(values.values())]}")
        seen[tuple(values.values())] = line


def snakemake_config_files(argv: list[str]) -> list[str]:
    """The files a Snakemake command line names with --configfile(s) (several may follow one flag, or `=file`)."""
    files, taking = [], False
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if flag in ("--configfile", "--configfiles"):
            taking = not eq
            files += [value] if eq else []
        elif arg.startswith("-"):
            taking = False
        elif taking:
            files.append(arg)
    return files


def main(argv: list[str] | None = None) -> int:
    """`python -m margrpo.experiment.config_checks <snakemake arguments>` (make run / make report): read the
    config files they name with margrpo's own reader before Snakemake starts, which renders a YTE template
    (running its code) at load."""
    import sys

    for path in snakemake_config_files(sys.argv[1:] if argv is None else argv):
        try:
            read_config_file(path)
        except ConfigError as err:
            print(f"margrpo: error: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
