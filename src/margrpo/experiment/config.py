"""Experiment config: one YAML per experiment, validated against the workflow schema and checked across fields.

The schema (`workflow/schemas/config.schema.yaml`) is the single source of defaults for the
workflow; stages call `load_config` so that a stage run by hand sees the same values as one run
by Snakemake, and validate their `--*-json` arguments against the same schema (`validate_section`).
Everything a run could trip over later is checked when the config loads (dry-run time): unknown
keys, wrong types (1.0 is no integer), non-finite numbers, undefined names, variant overrides, the
ablation table, and settings that validate one by one but would run wrong (`_check_settings`).
Errors name the key path.

This module holds those checks. Reading the file and the schema itself are in
`margrpo.experiment.schema`; what each stage reads of a config (train spec, results folders) in
`margrpo.experiment.specs`. Both are re-exported here, the import path the workflow and the stages use.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path
from typing import Any

from margrpo.experiment.config_checks import check_related, check_world  # the world's and the stages' own readers
from margrpo.experiment.schema import (
    SCHEMA_PATH,
    ConfigError,
    check_defined,
    check_finite,
    check_schema,
    load_schema,
    name_pattern,
    read_config_file,
    schema_section,
    validate_schema,
    validate_section,
)
from margrpo.experiment.specs import (
    LATER_GRPO_KEYS,
    RELATED_POLICIES,
    TOY_REVISION,
    pretrain_settings,
    related_policy,
    related_train_spec,
    shared_dirs,
    train_spec,
    validate_train_spec,
)

__all__ = [
    "ABLATION_COLUMNS",
    "LATER_GRPO_KEYS",
    "RELATED_POLICIES",
    "REPO_ROOT",
    "SCHEMA_PATH",
    "TOY_REVISION",
    "ConfigError",
    "check_defined",
    "check_grpo_run",
    "check_val_prompts",
    "load_config",
    "load_schema",
    "name_pattern",
    "names_scorer",
    "pretrain_settings",
    "read_config_file",
    "related_policy",
    "related_train_spec",
    "resolve_path",
    "schema_section",
    "shared_dirs",
    "train_spec",
    "validate_config",
    "validate_section",
    "validate_train_spec",
]

REPO_ROOT = SCHEMA_PATH.resolve().parents[2]  # the checkout (the schema links into workflow/schemas/)
ABLATION_COLUMNS = {"top_frac": float, "tau": float, "trajectories": int}  # variant switches a grid may vary


def validate_config(config: dict, source: str = "config", root: str | Path | None = None) -> dict:
    """Fill defaults in place and check types, enums and cross references; returns `config`.

    `root`: where a relative `experiments.ablations.table` is looked up when it is not in the
    working directory (the workflow's folder; default: this checkout).
    """
    validate_schema(config, source)
    check_finite(config, source)
    _check_references(config, source)
    _check_variants(config, source)
    _check_ablations(config, source, Path(root) if root else REPO_ROOT)
    _check_settings(config, source)
    check_world(config, source)
    check_related(config, source)
    return config


def load_config(source: str | Path | dict[str, Any]) -> dict:
    """Read (YAML file or dict), validate and fill defaults. Never mutates a dict passed in."""
    if isinstance(source, dict):
        return validate_config(copy.deepcopy(source), "config")
    path = Path(source)
    config = read_config_file(path)
    # a workflow's config/<name>.yaml names its files relative to the workflow folder, config/'s parent
    folder = path.resolve().parent
    return validate_config(config, str(path), root=folder.parent if folder.name == "config" else folder)


def _check_references(config: dict, source: str) -> None:
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
    need("variants", [exp["table1"]["baseline"], exp["table1"]["ours"]], "experiments.table1")
    if exp["ablations"]["enabled"]:
        need("policies", [exp["ablations"]["policy"]], "experiments.ablations.policy")
        need("rewards", [exp["ablations"]["reward"]], "experiments.ablations.reward")
        need("variants", [exp["ablations"]["variant"]], "experiments.ablations.variant")
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


def _check_variants(config: dict, source: str) -> None:
    """Each variant's effective GRPO settings (grpo + its overrides) must make a trainable run."""
    for name, variant in config["variants"].items():
        # no defaults: the overrides are a delta on grpo
        check_schema(schema_section("grpo"), variant["overrides"], source, fill=False, at=f"variants.{name}.overrides")
        g = {**config["grpo"], **variant["overrides"]}
        key = _variant_key(name, variant["overrides"])
        samplings = {f"policies.{pname}.sampling": policy["sampling"] for pname, policy in config["policies"].items()}
        check_grpo_run(
            g, samplings, config["train_processes"] * config["train_nodes"], source, key, f" in variant {name!r}"
        )


def _variant_key(name: str, overrides: dict):
    """The key path of a GRPO setting as variant `name` runs it: its override if it has one, else grpo's."""

    def key(k: str) -> str:
        return f"variants.{name}.overrides.{k}" if k in overrides else f"grpo.{k}"

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


def _check_settings(config: dict, source: str) -> None:
    """Settings that pass the schema one by one but would run wrong or fail late (issue 27)."""

    def fail(key: str, why: str):
        raise ConfigError(f"{source}: key '{key}': {why}")

    p, default = config["prompts"], lambda k: schema_section("prompts")["properties"][k]["default"]  # noqa: E731
    if p["source"] == "files" and p["n_train"] != default("n_train"):
        fail("prompts.n_train", "the files source trains on every prompt of prompts.train_file; remove n_train")
    if p["source"] == "files" and p["val_file"] and p["n_val"] != default("n_val"):
        fail("prompts.n_val", "prompts.val_file gives the validation prompts; remove n_val")
    val_size, val_from = _val_suite_size(config)
    for name, variant in config["variants"].items():
        g = {**config["grpo"], **variant["overrides"]}
        key = _variant_key(name, variant["overrides"])
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

    from margrpo.policy.memory import lora_leaves
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


def _check_ablations(config: dict, source: str, root: Path) -> None:
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
