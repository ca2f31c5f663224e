"""Helpers of the related-method stages (pretrain-mask, distill-marval, train-related): their JSON
entries read strictly (`margrpo.infra.readers`), train-related's spec and each method's settings, the mask
sampling and the teacher's sampling."""

from __future__ import annotations

from pathlib import Path

from margrpo.infra.files import InputError
from margrpo.infra.readers import check_keys, dataclass_from

METHODS = {"grpo-mask": "grpo", "maskgrpo": "mask_grpo", "marval-rl": None}  # --method -> MaskGRPOConfig.method
SPEC_KEYS = ("method", "related", "reward", "reward_models", "sampling", "device", "mixed_precision")


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


def read_spec(args) -> dict:
    """train-related's --spec-json, checked: known keys, the method --method names, a non-empty reward mix."""
    from margrpo.stages._common import json_arg

    spec = check_keys(json_arg(args.spec_json, "--spec-json"), SPEC_KEYS, "--spec-json")
    if spec.get("method", args.method) != args.method:
        raise InputError(f"--spec-json: method {spec['method']!r} disagrees with --method {args.method}")
    reward = check_keys(spec.get("reward"), ("name", "weights"), "--spec-json: reward")
    if not isinstance(reward.get("weights"), dict) or not reward["weights"]:
        raise InputError("--spec-json: reward.weights: expected a non-empty object {scorer: weight}")
    if not isinstance(spec.get("related", {}), dict):
        raise InputError("--spec-json: related: expected a JSON object of the method's settings")
    return {**spec, "method": args.method}


def build_reward(spec: dict, toyclip_dir: str | None, toypref_dir: str | None = None):
    from margrpo.rewards import build_reward_mix
    from margrpo.stages._common import reward_options

    weights = spec["reward"]["weights"]
    try:
        return build_reward_mix(
            weights, reward_options(weights, spec.get("reward_models", {}), toyclip_dir, toypref_dir)
        )
    except ValueError as err:
        raise InputError(f"--spec-json: reward: {err}") from None


def mask_settings(args, spec: dict):
    """(MaskGRPOConfig, MaskSamplingConfig) of a grpo-mask / maskgrpo spec."""
    from margrpo.related.maskgrpo.trainer import MaskGRPOConfig

    related = dict(spec.get("related", {}))
    if related.pop("method", METHODS[args.method]) != METHODS[args.method]:
        raise InputError(f"--spec-json: related.method disagrees with --method {args.method}")
    related["seed"] = args.seed
    sampling = mask_sampling(spec.get("sampling"), "--spec-json: sampling")
    related.setdefault("mask_steps", sampling.steps)  # not given: every one of the K unmasking steps
    if isinstance(related["mask_steps"], int) and related["mask_steps"] > sampling.steps:
        raise InputError(
            f"--spec-json: related.mask_steps: |M| = {related['mask_steps']} exceeds the {sampling.steps} unmasking "
            "steps (sampling.steps); lower it"
        )
    cfg = dataclass_from(MaskGRPOConfig, related, "--spec-json: related", fixed={"method": METHODS[args.method]})
    return cfg, sampling


def marval_settings(args, spec: dict):
    """(MARVALRLConfig, SamplingConfig) of a marval-rl spec; the reward weights come from reward.weights."""
    from margrpo.related.marval import MARVALRLConfig
    from margrpo.stages._common import sampling_config

    weights = spec["reward"]["weights"]
    if set(weights) - {"toyclip", "shapes"} or not weights.get("toyclip"):
        raise InputError(
            f"--spec-json: reward.weights: marval-rl needs a non-zero toyclip weight (its gradient) and "
            f"takes toyclip and shapes only, got {weights}"
        )
    related = {**spec.get("related", {}), "seed": args.seed}
    cfg = dataclass_from(
        MARVALRLConfig,
        related,
        "--spec-json: related",
        fixed={"toyclip_weight": float(weights["toyclip"]), "shapes_weight": float(weights.get("shapes", 0.0))},
    )
    if cfg.reg_weight:
        raise InputError(
            "--spec-json: related.reg_weight > 0 needs the teacher's distiller, which train-related does not build; "
            "set it to 0"
        )
    return cfg, sampling_config(spec.get("sampling", {}))


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
