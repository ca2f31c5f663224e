"""MAR policies behind one interface: the toy model, NOVA and Harmon; their layers, gradient checkpointing
(`checkpointing`), LoRA adapters (`lora`) and the toy's word-level tokenizer (`text`).

Layer 2 (see margrpo/__init__.py): it must not import rewards, grpo, toylab, related, evaluation, reporting,
experiment, stages, plan, cli.
"""

from margrpo.policy.base import MARPolicy, TextCondition, deterministic
from margrpo.policy.toy import ToyMAR, ToyMARConfig

__all__ = ["MARPolicy", "TextCondition", "ToyMAR", "ToyMARConfig", "deterministic", "load_policy"]


def load_policy(path, device="cpu") -> MARPolicy:
    """Load any policy from a folder (or a `policy.json` pointer written by `margrpo check-weights`), with
    the LoRA adapters saved beside it, if any (policy.lora.save_adapters)."""
    from pathlib import Path

    from margrpo.policy.lora import has_adapters, load_adapters

    p = Path(path)
    p = _pointed(p) if p.suffix == ".json" else p
    policy = _load_base(p, device)
    if has_adapters(p):
        load_adapters(policy, p)
    return policy


def _pointed(p):
    """The policy folder a `policy.json` pointer names."""
    from pathlib import Path

    from margrpo.infra.files import InputError, read_json

    pointer = read_json(p)
    if not isinstance(pointer, dict) or "path" not in pointer:
        raise InputError(f'{p}: expected a pointer {{"path": <policy folder>}} (written by `margrpo check-weights`)')
    return Path(pointer["path"])


def _load_base(p, device) -> MARPolicy:
    from margrpo.infra.files import InputError, read_json
    from margrpo.policy.harmon_files import is_harmon_folder
    from margrpo.policy.nova_files import is_nova_folder

    # Each real policy's module only where its folder is found: harmon.py imports transformers' Qwen2 (4 CPU-s,
    # which every toy train and sample job paid)
    if is_nova_folder(p):  # diffusers-style folder: model_index.json naming the NOVA pipeline
        from margrpo.policy.nova import NovaPolicy

        return NovaPolicy.from_pretrained(p, device)
    if is_harmon_folder(p):  # harmon_1.5b.pth + kl16.ckpt + the Qwen2.5 folder, or the transformers format
        from margrpo.policy.harmon import HarmonPolicy

        return HarmonPolicy.from_pretrained(p, device)
    config = p / "config.json"
    if not config.exists():
        raise FileNotFoundError(f"{p}: no config.json; expected a policy folder written by save_pretrained")
    raw = read_json(config)
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type == "toy-mar":
        return ToyMAR.from_pretrained(p, device)
    if model_type == "toy-mask":  # the discrete toy policy of MaskGRPO: not a MARPolicy (no diffusion head)
        raise InputError(
            f"{config}: a 'toy-mask' policy (margrpo.related.maskgrpo); the stages load it with "
            "margrpo.stages._related.load_any_policy"
        )
    raise InputError(
        f"{config}: unknown model_type {model_type!r}; known: 'toy-mar', NOVA (model_index.json), 'harmon', "
        "and 'toy-mask' through the stages"
    )
