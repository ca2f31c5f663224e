"""`ShapesReward`: the verifiable toy-world reward with the project's reward signature."""

from __future__ import annotations

import numpy as np
import torch

from margrpo.world.config import WorldConfig
from margrpo.world.scene import backdrop_level
from margrpo.world.scoring import score

FORMS = ("strict", "lenient")


def to_uint8_images(images: torch.Tensor) -> np.ndarray:
    """(B, 3, H, W) float in [0, 1] -> (B, H, W, 3) uint8 numpy (clamped, rounded)."""
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1] != 3:
        shape = tuple(images.shape) if hasattr(images, "shape") else type(images).__name__
        raise ValueError(f"expected images as a (B, 3, H, W) float tensor in [0, 1], got {shape}")
    x = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).cpu().numpy()


class ShapesReward:
    """Parse each image and score it against its prompt's spec (metadata["spec"], ["category"]).

    `form="strict"` penalises extra objects and fragments (the reported metric and the default
    reward); `"lenient"` ignores them. The prompts themselves are not read: the spec is the truth.
    """

    def __init__(self, form: str = "strict", world: WorldConfig | dict | None = None):
        if form not in FORMS:
            raise ValueError(f"Unknown form: {form!r}; expected one of {FORMS}")
        self.form = form
        self.cfg = WorldConfig.from_dict(world) if isinstance(world, dict) else (world or WorldConfig())

    def details(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> list[dict]:
        """Every score term per image (strict, lenient, binding, relation, count, extras, ...)."""
        arr = to_uint8_images(images)
        if not len(arr) == len(prompts) == len(metadata):
            raise ValueError(
                f"got {len(arr)} images, {len(prompts)} prompts and {len(metadata)} metadata entries; they must match"
            )
        missing = [i for i, m in enumerate(metadata) if not {"spec", "category"} <= set(m)]
        if missing:
            raise ValueError(
                f"metadata entries {missing} lack 'spec' / 'category'; ShapesReward needs ShapesWorld suite prompts"
            )
        return [score(m["spec"], img, m["category"], self.cfg) for img, m in zip(arr, metadata)]

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        values = [d[self.form] for d in self.details(images, prompts, metadata)]
        return torch.tensor(values, dtype=torch.float32, device=images.device)  # (B,)


class BackdropReward:
    """The world's aesthetic measured exactly: each image's backdrop brightness (`backdrop_level`, a fraction of the
    range). A metric beside the learned `toypref`, which was trained to prefer it: where toypref rises and this does
    not, toypref is being hacked; a value past the world's `backdrop_range` is a look no training image had."""

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        values = backdrop_level(to_uint8_images(images))
        return torch.as_tensor(values, dtype=torch.float32, device=images.device)  # (B,)


class RednessReward:
    """A colour target read exactly from the pixels: each image's mean red minus its mean blue, in [-1, 1].

    Why it exists: the climbing ladder's reward (docs/findings.md, "RL is seen to climb"). No prompt names it, every
    image of every prompt can earn it, and it is differentiable and exact, so one image carries far more signal than
    the preference reward or the parser's. Pushed hard it is a hack, and a visible one: objects drawn in the wrong
    colour (CompBench's colour column falls) and a tinted backdrop.
    """

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.ndim != 4 or images.shape[1] != 3:
            shape = tuple(images.shape) if hasattr(images, "shape") else type(images).__name__
            raise ValueError(f"expected images as a (B, 3, H, W) float tensor in [0, 1], got {shape}")
        x = images.float()
        return x[:, 0].mean((1, 2)) - x[:, 2].mean((1, 2))  # (B,)
