"""Experiment config: one YAML per experiment, read, validated against the workflow schema and checked across
fields, once, when it loads.

The schema (`workflow/schemas/config.schema.yaml`) is the single source of defaults for the workflow; stages
call `load_config` so that a stage run by hand sees the same values as one run by Snakemake. Everything a run
could trip over later is checked here at dry-run time: unknown keys, wrong types (1.0 is no integer), non-finite
numbers, undefined names, variant overrides, the ablation table, and settings that validate one by one but would
run wrong. Errors name the key path.

This module holds the order of those checks. The file and the schema are read in `margrpo.experiment.schema`;
the checks themselves are in `margrpo.experiment.config_checks`; what each stage reads of a config (train spec,
results folders) in `margrpo.experiment.specs`, and a train run's typed settings in `margrpo.experiment.settings`.
The first three are re-exported here, the import path the workflow and the stages use.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from margrpo.experiment.config_checks import (  # the checks across fields, and the world's and the stages' own readers
    ABLATION_COLUMNS,
    check_ablations,
    check_grpo_run,
    check_references,
    check_related,
    check_settings,
    check_val_prompts,
    check_variants,
    check_world,
    names_scorer,
    resolve_path,
)
from margrpo.experiment.schema import (
    SCHEMA_PATH,
    ConfigError,
    check_defined,
    check_finite,
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


def validate_config(config: dict, source: str = "config", root: str | Path | None = None) -> dict:
    """Fill defaults in place and check types, enums and cross references; returns `config`.

    `root`: where a relative `experiments.ablations.table` is looked up when it is not in the
    working directory (the workflow's folder; default: this checkout).
    """
    validate_schema(config, source)
    check_finite(config, source)
    check_references(config, source)
    check_variants(config, source)
    check_ablations(config, source, Path(root) if root else REPO_ROOT)
    check_settings(config, source)
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
