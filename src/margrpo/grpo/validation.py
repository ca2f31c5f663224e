"""Validation of a GRPO run: each validation prompt's reward under fixed noise, so that every run, method and step
is compared on the same samples (common random numbers), with the batches split over the run's processes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from margrpo.grpo.random_streams import VAL_SEED
from margrpo.grpo.rollout import SamplingConfig, generate
from margrpo.infra.runtime import autocast
from margrpo.policy.base import MARPolicy
from margrpo.prompts.suites import PromptSet
from margrpo.rewards.registry import RewardFn


@torch.no_grad()
def validation_batch(
    policy: MARPolicy,
    reward_fn: RewardFn,
    val: PromptSet,
    a: int,
    n: int,
    sampling: SamplingConfig,
    images: int,
    precision: str,
) -> tuple[list[float], torch.Tensor]:
    """Scores of validation prompts a .. min(n, a + 8) - 1 (each the mean over its `images` images) and the images.
    The noise comes from VAL_SEED + a alone, so every run, method and step that samples through `generate`
    sees the same noise: differences between them are paired (common random numbers)."""
    prompts, meta = val.prompts[a : min(n, a + 8)], val.metadata[a : min(n, a + 8)]
    with autocast(policy.device, precision):
        r = generate(
            policy, prompts, sampling, group_size=images, generator=torch.Generator().manual_seed(VAL_SEED + a)
        )
    reward = reward_fn(r.images, r.prompts, [m for m in meta for _ in range(images)])[0]
    return reward.view(len(prompts), images).mean(1).tolist(), r.images


@torch.no_grad()
def validation_rewards(
    policy: MARPolicy,
    reward_fn: RewardFn,
    val: PromptSet,
    sampling: SamplingConfig,
    engine,
    prompts: int,
    images: int,
    ema=None,
    log_images: Callable[[torch.Tensor], None] | None = None,
) -> list[float]:
    """Reward of each of the first `prompts` validation prompts (mean over its `images` images), its batches of 8
    prompts shared over the `engine`'s processes (grpo.engine). The noise of each batch comes from VAL_SEED + its
    offset alone, so every run, variant and step sees the same noise: differences between them are paired (common
    random numbers). `ema`: its averaged weights are the ones validated; `log_images`: given the first image of each
    of the first (up to 8) prompts."""
    n = min(prompts, len(val))
    scores = []  # (first prompt, scores) of this process's batches; batch a goes to process (a / 8) mod W
    starts = list(range(0, n, 8))
    mine, rounds = engine.validation_share(starts)
    with ema.applied(policy) if ema else contextlib.nullcontext():
        for i in range(rounds):
            a = mine[i] if i < len(mine) else starts[0]
            batch, grid = validation_batch(policy, reward_fn, val, a, n, sampling, images, engine.precision)
            if i >= len(mine):
                continue
            scores.append((a, batch))
            if a == 0 and log_images is not None:
                log_images(grid[::images])
    return [x for _, part in sorted(b for shares in engine.all_objects(scores) for b in shares) for x in part]
