"""Strict reading of user-given JSON entries into dataclasses: a stray key or a bad value is a one-line
error that names where it came from (`--policy-json`, a config key), never a TypeError from deep inside."""

from __future__ import annotations

import dataclasses

from margrpo.infra.files import InputError


def check_keys(value, allowed: tuple[str, ...], where: str) -> dict:
    """`value` as a dict whose keys all lie in `allowed`; otherwise an InputError naming the first stray key."""
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            raise InputError(f"{where}: unknown key {key!r}; expected one of {', '.join(allowed)}")
    return value


def dataclass_from(cls, value, where: str, fixed: dict | None = None):
    """`cls(**value, **fixed)`: unknown keys, keys the stage sets itself (`fixed`) and bad values are one-line
    errors."""
    fixed = fixed or {}
    value = {} if value is None else value
    names = tuple(f.name for f in dataclasses.fields(cls) if f.name not in fixed)
    if isinstance(value, dict) and set(value) & set(fixed):
        raise InputError(f"{where}: {sorted(set(value) & set(fixed))[0]!r} is set by the stage, not in this entry")
    check_keys(value, names, where)
    try:
        return cls(**value, **fixed)
    except (TypeError, ValueError) as err:
        raise InputError(f"{where}: {err}") from None
