"""Workarounds for the evaluator stack on CPU-only torch (docs/dependencies.md).

The registry has no CPU build of torchvision: the CUDA build installs, but importing it on CPU
torch fails with "operator torchvision::nms does not exist" because its fake-tensor registrations
refer to C++ operators that were never loaded. Declaring the two operator schemas first lets the
Python parts (transforms, models) import; the C++ ops themselves stay unavailable.
"""

from __future__ import annotations

import sys

_LIB = None


def ensure_torchvision_importable() -> None:
    """Call before the first `import torchvision` (hpsv2, image-reward, t2v-metrics import it)."""
    global _LIB
    if _LIB is not None or "torchvision" in sys.modules:
        return
    import torch

    try:
        torch.ops.torchvision.nms  # noqa: B018  (present when torchvision's C++ ops are loaded)
        return
    except (AttributeError, RuntimeError):
        pass
    _LIB = torch.library.Library("torchvision", "FRAGMENT")
    _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
