"""The config file and its schema: the YAML read safely, the schema's defaults filled, errors by key path.

`workflow/schemas/config.schema.yaml` is the single source of the workflow's defaults. This module
reads a config file (`read_config_file`: plain YAML, no key twice, no YTE template) and checks a value
against the schema or one section of it (`check_schema`, `validate_section`). The cross-field checks
of a whole config (`margrpo.experiment.config`) and the stages' specs (`margrpo.experiment.specs`)
build on it; it imports neither.

A config is trusted like a Snakefile: Snakemake renders a config carrying `__use_yte__` as a YTE
template, which runs code. margrpo's own reader (`read_config_file`) refuses such a file, and a key
given twice, which YAML would resolve silently to the last one.
"""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from margrpo.infra.files import InputError

SCHEMA_PATH = Path(__file__).parents[1] / "schemas" / "config.schema.yaml"


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


def check_schema(schema: dict, value: Any, where: str, fill: bool = True, at: str = "") -> None:
    """Raise ConfigError listing the schema violations of `value` (key paths below `at`); `fill`: defaults too."""
    validator = (_Validator if fill else _Strict)(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [
            f"{where}: key '{'.'.join(filter(None, [at, _key_path(e)])) or '<top level>'}': {_message(e)}"
            for e in errors[:10]
        ]
        raise ConfigError(lines[0] if len(lines) == 1 else "invalid config\n  " + "\n  ".join(lines))


def validate_schema(config: dict, source: str) -> None:
    """A whole config against the schema: its defaults filled in place, its violations raised by key path."""
    check_schema(_schema(), config, source)


def _message(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties" and error.schema.get("additionalProperties") is False:
        return f"unknown key; expected one of {', '.join(sorted(error.schema.get('properties', {})))}"
    return error.message


def validate_section(value: dict, section: str, what: str) -> dict:
    """A copy of `value` validated against one section of the schema, defaults filled (stage arguments)."""
    value = copy.deepcopy(value)
    check_schema(schema_section(section), value, what)
    check_finite(value, what)
    return value


def check_finite(value: Any, source: str, path: str = "") -> None:
    """NaN and infinity are valid YAML (.nan, .inf) but no setting means anything by them."""
    if isinstance(value, dict):
        for k, v in value.items():
            check_finite(v, source, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_finite(v, source, f"{path}.{i}")
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
