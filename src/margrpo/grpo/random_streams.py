"""The random streams every RL method of the lab draws from, derived from (seed, step, stream): a resumed
run draws exactly what it would have, and methods that share a stream index share their noise."""

from __future__ import annotations

import torch

VAL_SEED = 20_251_121  # validation noise: the same for every run, method and step (common random numbers)


def step_seed(seed: int, step: int, stream: int) -> int:
    return (seed * 1_000_003 + step) * 16 + stream


def step_generator(seed: int, step: int, stream: int) -> torch.Generator:
    """Per-step RNG derived from (seed, step, stream)."""
    return torch.Generator().manual_seed(step_seed(seed, step, stream))


def group_generators(seed: int, step: int, stream: int, groups: range) -> list[torch.Generator]:
    """One generator per prompt group, from (seed, step, stream, group index in the step's batch): a
    group draws the same samples whichever process rolls it out, so a run's samples do not depend on
    the number of processes."""
    return [torch.Generator().manual_seed(step_seed(seed, step, stream) * 65_536 + 1 + g) for g in groups]
