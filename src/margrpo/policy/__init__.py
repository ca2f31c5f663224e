"""MAR policies behind one interface: the toy model, NOVA and Harmon."""

from margrpo.policy.base import MARPolicy, TextCondition, deterministic
from margrpo.policy.toy import ToyMAR, ToyMARConfig

__all__ = ["MARPolicy", "TextCondition", "ToyMAR", "ToyMARConfig", "deterministic", "load_policy"]


def load_policy(path, device="cpu") -> MARPolicy:
    """Load any policy from a folder (or a `policy.json` pointer written by `margrpo check-weights`)."""
    import json
    from pathlib import Path

    p = Path(path)
    if p.suffix == ".json":
        p = Path(json.loads(p.read_text())["path"])
    from margrpo.policy.nova import NovaPolicy  # cheap: heavy imports happen inside from_pretrained

    from margrpo.policy.harmon import HarmonPolicy

    if NovaPolicy.is_checkpoint(p):  # diffusers-style folder: model_index.json naming the NOVA pipeline
        return NovaPolicy.from_pretrained(p, device)
    if HarmonPolicy.is_checkpoint(p):  # harmon_1.5b.pth + kl16.ckpt + the Qwen2.5 folder
        return HarmonPolicy.from_pretrained(p, device)
    config = p / "config.json"
    if not config.exists():
        raise FileNotFoundError(f"{p}: no config.json; expected a policy folder written by save_pretrained")
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type == "toy-mar":
        return ToyMAR.from_pretrained(p, device)
    raise ValueError(f"{config}: unknown model_type {model_type!r}; known: 'toy-mar', NOVA (model_index.json), 'harmon'")
