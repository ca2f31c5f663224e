"""Experiment config: one YAML per experiment, validated against the workflow schema.

The schema (`workflow/schemas/config.schema.yaml`) is the single source of defaults for the
workflow; stages call `load_config` so that a stage run by hand sees the same values as one run
by Snakemake, and validate their `--*-json` arguments against the same schema (`validate_section`).
Everything a run could trip over later is checked when the config loads (dry-run time): unknown
keys, wrong types (1.0 is no integer), non-finite numbers, undefined names, variant overrides, the
ablation table, and settings that validate one by one but would run wrong (`_check_settings`).
Errors name the key path.

A config is trusted like a Snakefile: Snakemake renders a config carrying `__use_yte__` as a YTE
template, which runs code. margrpo's own loader (`read_config_file`) refuses such a file, and a key
given twice, which YAML would resolve silently to the last one.
"""

from __future__ import annotations

import copy
import csv
import functools
import math
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from margrpo.infra.io import InputError, spec_hash

SCHEMA_PATH = Path(__file__).parents[1] / "schemas" / "config.schema.yaml"
REPO_ROOT = SCHEMA_PATH.resolve().parents[2]  # the checkout (the schema links into workflow/schemas/)
ABLATION_COLUMNS = {"top_frac": float, "tau": float, "trajectories": int}  # variant switches a grid may vary


class ConfigError(InputError):
    """A config that does not match the schema or refers to something undefined."""


def _with_defaults(validator_class):
    """Validator that fills `default` values while validating (what snakemake's validate does)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for key, sub in properties.items():
                if "default" in sub and key not in instance:
                    instance[key] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def _strict_integers(validator_class):
    """JSON Schema counts 1.0 as an integer; a YAML `steps: 1.0` then reaches range() as a float."""
    checker = validator_class.TYPE_CHECKER.redefine(
        "integer", lambda _, x: isinstance(x, int) and not isinstance(x, bool)
    )
    return jsonschema.validators.extend(validator_class, type_checker=checker)


_Strict = _strict_integers(jsonschema.Draft202012Validator)
_Validator = _with_defaults(_Strict)


@functools.cache
def _schema() -> dict:
    with open(SCHEMA_PATH) as f:
        return yaml.safe_load(f)


def load_schema() -> dict:
    return copy.deepcopy(_schema())


def name_pattern() -> str:
    """The regex of a policy, reward or variant name (the schema's), unanchored: the workflow's wildcards."""
    return _schema()["$defs"]["name"]["pattern"].strip("^$")


def schema_section(section: str) -> dict:
    """The sub-schema at a dotted path, `*` for a map's values: "grpo", "policies.*.sampling"."""
    node = _schema()
    for part in section.split("."):
        node = node["additionalProperties"] if part == "*" else node["properties"][part]
    return {**node, "$defs": _schema()["$defs"]}  # local $refs still resolve


def _key_path(error: jsonschema.ValidationError) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    if "propertyNames" in error.absolute_schema_path:  # a key that is not a valid name: the path names it
        return ".".join(filter(None, [path, str(error.instance)]))
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        if extra and error.schema.get("additionalProperties") is False:
            return ".".join(filter(None, [path, extra[0]]))
    return path


def _errors(schema: dict, value: Any, where: str, fill: bool = True, at: str = "") -> None:
    """Raise ConfigError listing the schema violations of `value` (key paths below `at`); `fill`: defaults too."""
    validator = (_Validator if fill else _Strict)(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [
            f"{where}: key '{'.'.join(filter(None, [at, _key_path(e)])) or '<top level>'}': {_message(e)}"
            for e in errors[:10]
        ]
        raise ConfigError(lines[0] if len(lines) == 1 else "invalid config\n  " + "\n  ".join(lines))


def _message(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties" and error.schema.get("additionalProperties") is False:
        return f"unknown key; expected one of {', '.join(sorted(error.schema.get('properties', {})))}"
    return error.message


def validate_config(config: dict, source: str = "config", root: str | Path | None = None) -> dict:
    """Fill defaults in place and check types, enums and cross references; returns `config`.

    `root`: where a relative `experiments.ablations.table` is looked up when it is not in the
    working directory (the workflow's folder; default: this checkout).
    """
    _errors(_schema(), config, source)
    _check_finite(config, source)
    _check_references(config, source)
    _check_variants(config, source)
    _check_ablations(config, source, Path(root) if root else REPO_ROOT)
    _check_settings(config, source)
    from margrpo.experiment.config_checks import (
        check_related,
        check_world,
    )  # the stages' own readers: imported when needed

    check_world(config, source)
    check_related(config, source)
    return config


def validate_section(value: dict, section: str, what: str) -> dict:
    """A copy of `value` validated against one section of the schema, defaults filled (stage arguments)."""
    value = copy.deepcopy(value)
    _errors(schema_section(section), value, what)
    _check_finite(value, what)
    return value


def _check_finite(value: Any, source: str, path: str = "") -> None:
    """NaN and infinity are valid YAML (.nan, .inf) but no setting means anything by them."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, source, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, source, f"{path}.{i}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{source}: key '{path or '<top level>'}': {value} is not a finite number")


def check_defined(config: dict, kind: str, names, where: str, source: str = "config") -> None:
    """Every name must be defined under `config[kind]` (policies, rewards, variants)."""
    for name in names:
        if name not in config[kind]:
            raise ConfigError(
                f"{source}: key '{where}': {name!r} is not defined under '{kind}' "
                f"(defined: {', '.join(sorted(config[kind]))})"
            )


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
                f"{source}: key 'policies.{name}.path': a {policy['kind']} policy loads from a local folder; set its path"
            )
    for scorer in ("toyclip", "toypref"):  # the scorers the pipeline trains
        for setting, weights in config["rewards"].items():
            if scorer in weights and not config[scorer]["enabled"]:
                raise ConfigError(
                    f"{source}: key 'rewards.{setting}.{scorer}': the {scorer} scorer is disabled ({scorer}.enabled: false)"
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
        where = f"variants.{name}.overrides"
        _errors(schema_section("grpo"), variant["overrides"], source, fill=False, at=where)  # no defaults: a delta
        g = {**config["grpo"], **variant["overrides"]}
        key = lambda k: f"{where}.{k}" if k in variant["overrides"] else f"grpo.{k}"  # noqa: E731
        samplings = {f"policies.{pname}.sampling": policy["sampling"] for pname, policy in config["policies"].items()}
        check_grpo_run(
            g, samplings, config["train_processes"] * config["train_nodes"], source, key, f" in variant {name!r}"
        )


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
            f"{images} images of a process's batch (batch_prompts x group_size / (train_processes x train_nodes)){context}"
        )
    for where, s in samplings.items():
        if g["mask_steps"] > s["ar_steps"]:
            raise ConfigError(
                f"{source}: key '{key('mask_steps')}': |M| = {g['mask_steps']} exceeds {where}.ar_steps = {s['ar_steps']}"
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
            f"{source}: key '{key}': {val_prompts} exceeds the {val_size} prompts of the validation suite ({val_from}){context}"
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
        key = lambda k: f"variants.{name}.overrides.{k}" if k in variant["overrides"] else f"grpo.{k}"  # noqa: E731
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
            continue  # nova / harmon token grids and parameter names come from their weights: checked when training starts
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
        _check_finite(values, f"{where}: {path}:{line}")
        _errors(schema, values, f"{where}: {path}:{line}", fill=False)  # ranges of top_frac, trajectories
        if tuple(values.values()) in seen:
            raise ConfigError(f"{where}: {path}:{line} repeats line {seen[tuple(values.values())]}")
        seen[tuple(values.values())] = line


def load_config(source: str | Path | dict[str, Any]) -> dict:
    """Read (YAML file or dict), validate and fill defaults. Never mutates a dict passed in."""
    if isinstance(source, dict):
        return validate_config(copy.deepcopy(source), "config")
    path = Path(source)
    config = read_config_file(path)
    # a workflow's config/<name>.yaml names its files relative to the workflow folder, config/'s parent
    folder = path.resolve().parent
    return validate_config(config, str(path), root=folder.parent if folder.name == "config" else folder)


def read_config_file(path: str | Path) -> dict:
    """A config file's mapping, unvalidated: plain YAML, no key twice, no YTE template (module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    text = path.read_text()
    try:
        config = yaml.safe_load(text) or {}
        _check_duplicate_keys(yaml.compose(text, Loader=yaml.SafeLoader), str(path))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(config).__name__}")
    if "__use_yte__" in config:
        raise ConfigError(
            f"{path}: key '__use_yte__': a YTE template runs code; margrpo reads plain YAML configs only "
            "(render it with `yte` and pass the result)"
        )
    return config


def _check_duplicate_keys(node, source: str, path: str = "") -> None:
    """YAML lets a mapping repeat a key and keeps the last value: refuse it, naming the key path and lines."""
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicate_keys(item, source, f"{path}.{i}" if path else str(i))
    elif isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            where = f"{path}.{key.value}" if path else str(key.value)
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise ConfigError(
                        f"{source}: key '{where}' is given twice (lines {seen[key.value]} and "
                        f"{key.start_mark.line + 1}); YAML would keep the last silently"
                    )
                seen[key.value] = key.start_mark.line + 1
            _check_duplicate_keys(value, source, where)


LATER_GRPO_KEYS = ("trackers", "ema_decay", "advantages", "replay_chunk")  # grpo keys added after runs were cached


def train_spec(config: dict, policy: str, reward: str, variant: str, variant_overrides: dict | None = None) -> dict:
    """Everything one GRPO run depends on, and nothing else.

    Snakemake passes this (not the whole config) to `margrpo train`, so editing a plot option
    never invalidates a training run.
    """
    for kind, name, flag in (
        ("policies", policy, "--policy"),
        ("rewards", reward, "--reward"),
        ("variants", variant, "--variant"),
    ):
        check_defined(config, kind, [name], flag, "train")
    var = dict(config["variants"][variant])
    var.update(variant_overrides or {})
    grpo = dict(config["grpo"])
    grpo.update(var.pop("overrides", {}) or {})
    if config["policies"][policy].get("rl_frozen"):  # only when set: other runs keep their cached spec
        grpo["frozen"] = list(config["policies"][policy]["rl_frozen"])
    if config["policies"][policy].get("gradient_checkpointing"):  # memory levers: routed the same way
        grpo["gradient_checkpointing"] = True
    if config["policies"][policy].get("lora"):
        grpo["lora"] = dict(config["policies"][policy]["lora"])
    if config["policies"][policy].get("sharding", "replicate") != "replicate":
        grpo["sharding"] = config["policies"][policy]["sharding"]
    defaults = schema_section("grpo")["properties"]
    for key in LATER_GRPO_KEYS:  # at their default they stay out, so that runs cached before them keep their spec
        if key in grpo and grpo[key] == defaults[key]["default"]:
            del grpo[key]
    weights = config["rewards"][reward]
    return {
        "grpo": grpo,
        "variant": {"name": variant, **var},
        "reward": {"name": reward, "weights": weights},
        "reward_models": {k: v for k, v in config["reward_models"].items() if k in weights},
        "sampling": config["policies"][policy]["sampling"],
        "device": config["device"],
        "mixed_precision": config["mixed_precision"],
        "threads": config["threads"],
    }


def validate_train_spec(spec: dict, what: str = "--spec-json") -> dict:
    """A `train_spec` (as `margrpo train` receives it) checked section by section against the schema."""
    missing = sorted({"grpo", "variant", "reward", "sampling"} - set(spec))
    if missing:
        raise ConfigError(f"{what}: missing key(s) {missing} (a margrpo.experiment.config.train_spec)")
    spec = copy.deepcopy(spec)
    routed = {
        k: spec["grpo"].pop(k) for k in ("frozen", "gradient_checkpointing", "lora", "sharding") if k in spec["grpo"]
    }  # policy keys
    spec["grpo"] = validate_section(spec["grpo"], "grpo", f"{what} grpo")
    spec["grpo"].update(routed)
    name = spec["variant"].pop("name", None)
    spec["variant"] = {"name": name, **validate_section(spec["variant"], "variants.*", f"{what} variant")}
    spec["variant"].pop("overrides", None)
    spec["sampling"] = validate_section(spec["sampling"], "policies.*.sampling", f"{what} sampling")
    _errors(schema_section("rewards.*"), spec["reward"].get("weights"), f"{what} reward.weights")
    _check_finite(spec["reward"].get("weights"), f"{what} reward.weights")
    return spec


def pretrain_settings(policy: dict) -> dict:
    """What pre-training reads of a policy's config, and nothing else: editing its warm-up, RL or
    weights settings never reruns pre-training."""
    return {k: policy[k] for k in ("kind", "head", "model", "pretrain", "sampling")}


# The revision of the toy models' code defaults and architectures (ToyMARConfig, the toy text encoder,
# toyclip, toy-mask). Part of the hash of every stage that trains one, so that a change of what the code
# builds, not only of the config, moves those folders: no result of an older toy is read as new.
# 2: the toy in the real models' proportions (a 64-wide head, 9% of the parameters; our own text stack).
# 3: scenes on a backdrop that varies per scene (the aesthetic of the toy preference reward, toypref).
TOY_REVISION = 3


def shared_dirs(config: dict, results: str = "results") -> dict:
    """Folders of the stages that experiments share, each keyed by a hash of exactly the settings
    that stage reads, its inputs' folders included (`results/pretrain/toy-nova-1a2b3c4d`): configs
    coexist, and share a stage exactly where those settings agree. Each folder's spec.json (written
    by its stage) records what it ran with.

    Returns {"data": dir, "toyclip": dir, "toypref": dir, "base": {policy: dir}, "warmup": {policy: dir}, "related": {policy: dir}};
    "base" holds results/pretrain/<policy>-<hash> (toy) or results/weights/<policy>-<hash> (real weights);
    "related" the bases of Table 3's related methods (toy-mask, toy-marval) when that experiment is on.
    """

    def folder(stage: str, label: str, settings: dict) -> str:
        return f"{results}/{stage}/{label}-{spec_hash(settings)}"

    prompts, precision = config["prompts"], config["mixed_precision"]
    data = folder(
        "data",
        prompts["source"],
        {"prompts": prompts, "world": config["world"] if prompts["source"] == "shapesworld" else None},
    )
    toy = {"toy_revision": TOY_REVISION}
    toyclip = folder("toyclip", "toyclip", {"data": data, **toy, **_without(config["toyclip"], "enabled")})
    dirs = {
        "data": data,
        "toyclip": toyclip,
        "toypref": folder("toypref", "toypref", {"toyclip": toyclip, **toy, **_without(config["toypref"], "enabled")}),
        "base": {},
        "warmup": {},
        "related": {},
    }
    for name, policy in config["policies"].items():
        if policy["kind"] == "toy":
            # sampling shapes only the quality report: a change reruns the job, which finds its training
            # finished in state/ (keyed without sampling) and rewrites policy/ and quality.json
            base = folder(
                "pretrain",
                name,
                {"data": data, "precision": precision, **toy, **_without(pretrain_settings(policy), "sampling")},
            )
        else:
            base = folder("weights", name, {"kind": policy["kind"], "path": policy["path"]})
        dirs["base"][name] = base
        if policy["warmup"]["enabled"]:
            dirs["warmup"][name] = folder(
                "warmup",
                name,
                {"policy": base, "data": data, "precision": precision, **_without(policy["warmup"], "enabled")},
            )  # sampling: as pre-training
    related = config["experiments"]["related"]
    if related["enabled"]:  # the related methods' bases (issue #19): toy-mask pre-trained, toy-marval distilled
        teacher = related["marval"]["teacher"]
        teacher_dir = dirs["warmup"].get(teacher, dirs["base"][teacher])
        dirs["related"]["toy-mask"] = folder(
            "pretrain", "toy-mask", {"data": data, **toy, **_without(related_policy(config, "toy-mask"), "sampling")}
        )
        dirs["related"]["toy-marval"] = folder(
            "distill",
            "toy-marval",
            {"teacher": teacher_dir, "data": data, **_without(related_policy(config, "toy-marval"), "sampling")},
        )
    return dirs


RELATED_POLICIES = {
    "grpo-onestep": "toy-marval",
    "marval-rl": "toy-marval",
    "grpo-mask": "toy-mask",
    "maskgrpo": "toy-mask",
}


def related_policy(config: dict, name: str) -> dict:
    """The policy entry `margrpo pretrain-mask` (toy-mask) or `margrpo distill-marval` (toy-marval) reads."""
    related = config["experiments"]["related"]
    if name == "toy-mask":
        return {"kind": "toy-mask", **related["mask"]}
    teacher = related["marval"]["teacher"]
    return {
        "kind": "toy-marval",
        "teacher": teacher,
        "distill": related["marval"]["distill"],
        "sampling": {**config["policies"][teacher]["sampling"], **related["marval"]["sampling"]},
    }


def related_train_spec(config: dict, method: str) -> dict:
    """What one related run depends on: `margrpo train`'s spec for GRPO on the one-step policy (|T| = 1),
    else the spec `margrpo train-related` reads (the method's own settings)."""
    related = config["experiments"]["related"]
    reward = related["reward"]
    settings = dict(related["settings"][method])
    if method == "grpo-onestep":
        spec = train_spec(config, related["marval"]["teacher"], reward, "grpo")
        spec["sampling"] = related_policy(config, "toy-marval")["sampling"]
        spec["grpo"].update({"diffusion_steps": 1, **settings})
        return spec
    sampling = related_policy(config, RELATED_POLICIES[method]).get("sampling", {})
    return {
        "method": method,
        "related": settings,
        "reward": {"name": reward, "weights": config["rewards"][reward]},
        "reward_models": {k: v for k, v in config["reward_models"].items() if k in config["rewards"][reward]},
        "sampling": sampling,
        "device": config["device"],
        "mixed_precision": config["mixed_precision"],
    }


def _without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}
