"""Images in which the exact parser finds no object of a palette colour: a base that failed to draw (the failure
Harmon's head warm-up repairs, the paper's Appendix C.2 and design.md §3.11).

Kept apart from `evaluation.quality`, whose code the shipped bases' digests cover: the warm-up reports this share
before and after itself (`quality.json`: `no_valid_object`) without moving a shipped stage's code.
"""

from __future__ import annotations

import numpy as np


def failed(image: np.ndarray, world_cfg=None) -> bool:
    """No object of a palette colour in `image` ((H, W, 3) uint8): only backdrop, fragments or off-palette blobs."""
    from margrpo.world import parse

    return not any(o["color"] is not None for o in parse(image, world_cfg))


def failed_share(images: np.ndarray, world_cfg=None) -> float:
    """The share of `images` ([N, H, W, 3] uint8) that `failed`."""
    return float(np.mean([failed(img, world_cfg) for img in images])) if len(images) else float("nan")
