"""The random streams every RL method of the lab draws from, derived from (seed, step, stream): a resumed
run draws exactly what it would have, and methods that share a stream index share their noise."""

from __future__ import annotations

from enum import IntEnum

import torch


class Stream(IntEnum):
    """What a GRPO step draws from each stream (the numbers are part of every run's samples: never renumber)."""

    PROMPTS = 0  # which training prompts the step takes
    ROLLOUT = 1  # the rollout's orders and noise, per prompt group
    MTE = 2  # MTE's extra trajectories, per prompt group
    STEPS = 3  # the chosen |M| AR steps and their |T| diffusion steps
    SHUFFLE = 4  # the shuffled-advantage control's permutation


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
