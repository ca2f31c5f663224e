"""What every training loop takes from the machine and the schedule: mixed precision, the learning-rate
schedule, peak memory for the logs. The EMA of the weights is in `ema`, the trackers in `trackers`."""

from __future__ import annotations

import math
import resource

import torch

PRECISIONS = ("no", "bf16", "fp16")


def autocast(device: torch.device, precision: str):
    """torch.autocast for `precision` ("no": full float32, "bf16", "fp16") on the device's type."""
    if precision == "no":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def warmup_cosine(step: int, steps: int, warmup: int, floor: float = 0.0) -> float:
    """LR factor of step `step` of `steps`: linear warm-up over `warmup` steps, then cosine decay to `floor`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def peak_memory_mb() -> float:
    """Peak GPU memory allocated by torch, or on CPU this process's max resident set, in MiB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
