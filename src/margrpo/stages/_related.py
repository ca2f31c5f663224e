"""Helpers of the related-method stages (pretrain-mask, distill-marval, train-related): their JSON
entries read strictly (`margrpo.infra.readers`), the mask sampling and the teacher's sampling."""

from __future__ import annotations

from pathlib import Path

from margrpo.infra.files import InputError
from margrpo.infra.readers import check_keys, dataclass_from


def policy_entry(text: str, kind: str, keys: tuple[str, ...], stage: str) -> dict:
    """The --policy-json entry of a related policy: known keys only, and the `kind` this stage builds."""
    from margrpo.stages._common import json_arg

    entry = check_keys(json_arg(text, "--policy-json"), keys, "--policy-json")
    if entry.get("kind") != kind:
        raise InputError(f"--policy-json: kind must be {kind!r} for {stage}, got {entry.get('kind')!r}")
    return entry


def mask_sampling(value, where: str):
    """MaskSamplingConfig of a toy-mask policy's `sampling` entry."""
    from margrpo.related.maskgrpo.rollout import MaskSamplingConfig

    return dataclass_from(MaskSamplingConfig, value, where)


def teacher_sampling(teacher_dir: str | Path):
    """The teacher's own sampling (K, CFG scale and schedule), from the spec.json `margrpo pretrain` wrote
    beside it."""
    from margrpo.infra.files import read_json
    from margrpo.stages._common import sampling_config

    path = Path(teacher_dir).parent / "spec.json"
    if not path.is_file():
        raise InputError(
            f"{path}: not found; distill-marval reads the teacher's sampling from the spec.json "
            "that `margrpo pretrain` writes beside its policy folder"
        )
    spec = read_json(path)
    try:
        return sampling_config(spec["policy_json"]["sampling"])
    except (KeyError, TypeError):
        raise InputError(f"{path}: no policy_json.sampling (the teacher's sampling settings)") from None


def load_any_policy(path: str | Path, device="cpu"):
    """Any policy folder the pipeline writes: MaskGRPO's toy-mask policy, or what `margrpo.policy.load_policy` reads.
    The dispatch lives here, above both packages: the policy package must not import a related method."""
    from margrpo.infra.files import read_json
    from margrpo.policy import load_policy
    from margrpo.related.maskgrpo.policy import ToyMaskPolicy

    config = Path(path) / "config.json"
    raw = read_json(config) if Path(path).is_dir() and config.is_file() else None
    if isinstance(raw, dict) and raw.get("model_type") == "toy-mask":
        return ToyMaskPolicy.from_pretrained(path, device)
    return load_policy(path, device)
