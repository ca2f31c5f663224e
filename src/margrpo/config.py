"""Experiment config: one YAML per experiment, validated against the workflow schema.

The schema (`workflow/schemas/config.schema.yaml`) is the single source of defaults for the
workflow; stages call `load_config` so that a stage run by hand sees the same values as one run
by Snakemake. Unknown keys and wrong types fail with the key path in the message.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).with_name("schemas") / "config.schema.yaml"


class ConfigError(ValueError):
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


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def load_schema() -> dict:
    with open(SCHEMA_PATH) as f:
        return yaml.safe_load(f)


def _key_path(error: jsonschema.ValidationError) -> str:
    path = ".".join(str(p) for p in error.absolute_path)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        if extra and error.schema.get("additionalProperties") is False:
            return ".".join(filter(None, [path, extra[0]]))
    return path or "<top level>"


def validate_config(config: dict, source: str = "config") -> dict:
    """Fill defaults in place and check types, enums and cross references; returns `config`."""
    schema = load_schema()
    errors = sorted(_Validator(schema).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{source}: key '{_key_path(e)}': {e.message}" for e in errors[:10]]
        raise ConfigError("invalid config\n  " + "\n  ".join(lines))
    _check_references(config, source)
    return config


def _check_references(config: dict, source: str) -> None:
    """Names used in `experiments` must be defined in `policies`, `rewards` and `variants`."""

    def need(kind: str, names, where: str):
        for name in names:
            if name not in config[kind]:
                raise ConfigError(
                    f"{source}: key '{where}': {name!r} is not defined under '{kind}' "
                    f"(defined: {', '.join(sorted(config[kind]))})"
                )

    exp = config["experiments"]
    for table in ("ladder", "table1"):
        need("policies", exp[table]["policies"], f"experiments.{table}.policies")
        need("rewards", exp[table]["rewards"], f"experiments.{table}.rewards")
    need("variants", exp["ladder"]["variants"], "experiments.ladder.variants")
    need("variants", [exp["table1"]["baseline"], exp["table1"]["ours"]], "experiments.table1")
    if exp["ablations"]["enabled"]:
        need("policies", [exp["ablations"]["policy"]], "experiments.ablations.policy")
        need("rewards", [exp["ablations"]["reward"]], "experiments.ablations.reward")
        need("variants", [exp["ablations"]["variant"]], "experiments.ablations.variant")
    for name, policy in config["policies"].items():
        if policy["kind"] != "toy" and not policy.get("path"):
            raise ConfigError(f"{source}: key 'policies.{name}.path': a {policy['kind']} policy loads from a local folder; set its path")
    for name, policy in config["policies"].items():
        s, g = policy["sampling"], config["grpo"]
        if g["mask_steps"] > s["ar_steps"]:
            raise ConfigError(f"{source}: key 'grpo.mask_steps': |M| = {g['mask_steps']} exceeds policies.{name}.sampling.ar_steps = {s['ar_steps']}")
        if g["diffusion_steps"] > s["diffusion_steps"] - 1:
            raise ConfigError(f"{source}: key 'grpo.diffusion_steps': |T| = {g['diffusion_steps']} exceeds the {s['diffusion_steps'] - 1} stochastic steps of policies.{name}.sampling.diffusion_steps")
    for setting, weights in config["rewards"].items():
        if "toyclip" in weights and not config["toyclip"]["enabled"]:
            raise ConfigError(f"{source}: key 'rewards.{setting}.toyclip': the toyclip scorer is disabled (toyclip.enabled: false)")


def load_config(source: str | Path | dict[str, Any]) -> dict:
    """Read (YAML file or dict), validate and fill defaults. Never mutates a dict passed in."""
    if isinstance(source, dict):
        return validate_config(copy.deepcopy(source), "config")
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(config).__name__}")
    return validate_config(config, str(path))


def config_from_args(config: str | None, config_json: str | None) -> dict:
    """Stages accept `--config FILE` (by hand) or `--config-json STR` (from Snakemake params)."""
    if config_json:
        return load_config(json.loads(config_json))
    if config:
        return load_config(config)
    raise ConfigError("give --config FILE or --config-json")


def train_spec(config: dict, policy: str, reward: str, variant: str, variant_overrides: dict | None = None) -> dict:
    """Everything one GRPO run depends on, and nothing else.

    Snakemake passes this (not the whole config) to `margrpo train`, so editing a plot option
    never invalidates a training run.
    """
    var = dict(config["variants"][variant])
    var.update(variant_overrides or {})
    grpo = dict(config["grpo"])
    grpo.update(var.pop("overrides", {}) or {})
    if config["policies"][policy].get("rl_frozen"):  # only when set: other runs keep their cached spec
        grpo["frozen"] = list(config["policies"][policy]["rl_frozen"])
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
