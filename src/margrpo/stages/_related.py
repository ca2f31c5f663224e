"""Helpers of the related-method stages (pretrain-mask, distill-marval, train-related): strict reading of
their JSON entries into dataclasses, with one-line errors that name the key."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from margrpo.io import InputError


def check_keys(value, allowed: tuple[str, ...], where: str) -> dict:
    """`value` as a dict whose keys all lie in `allowed`; otherwise an InputError naming the first stray key."""
    if not isinstance(value, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            raise InputError(f"{where}: unknown key {key!r}; expected one of {', '.join(allowed)}")
    return value


def policy_entry(text: str, kind: str, keys: tuple[str, ...], stage: str) -> dict:
    """The --policy-json entry of a related policy: known keys only, and the `kind` this stage builds."""
    from margrpo.stages._common import json_arg

    entry = check_keys(json_arg(text, "--policy-json"), keys, "--policy-json")
    if entry.get("kind") != kind:
        raise InputError(f"--policy-json: kind must be {kind!r} for {stage}, got {entry.get('kind')!r}")
    return entry


def dataclass_from(cls, value, where: str, fixed: dict | None = None):
    """`cls(**value, **fixed)`: unknown keys, keys the stage sets itself (`fixed`) and bad values are one-line errors."""
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


def mask_sampling(value, where: str):
    """MaskSamplingConfig of a toy-mask policy's `sampling` entry."""
    from margrpo.mask_rollout import MaskSamplingConfig

    return dataclass_from(MaskSamplingConfig, value, where)


def teacher_sampling(teacher_dir: str | Path):
    """The teacher's own sampling (K, CFG scale and schedule), from the spec.json `margrpo pretrain` wrote beside it."""
    from margrpo.io import read_json
    from margrpo.stages._common import sampling_config

    path = Path(teacher_dir).parent / "spec.json"
    if not path.is_file():
        raise InputError(f"{path}: not found; distill-marval reads the teacher's sampling from the spec.json "
                         "that `margrpo pretrain` writes beside its policy folder")
    spec = read_json(path)
    try:
        return sampling_config(spec["policy_json"]["sampling"])
    except (KeyError, TypeError):
        raise InputError(f"{path}: no policy_json.sampling (the teacher's sampling settings)") from None
