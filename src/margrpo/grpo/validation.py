"""Validation of a GRPO run: each validation prompt's reward under fixed noise, so that every run, method and step
is compared on the same samples (common random numbers), with the batches split over the run's processes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from margrpo.grpo.random_streams import VAL_SEED
from margrpo.grpo.rollout import SamplingConfig, generate
from margrpo.infra.runtime import autocast
from margrpo.infra.trackers import log_image_grid
from margrpo.policy.base import MARPolicy
from margrpo.prompts.suites import PromptSet

RewardFn = Callable[[torch.Tensor, list[str], list[dict]], tuple[torch.Tensor, dict[str, torch.Tensor]]]


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
def validate(trainer) -> list[float]:  # a GRPOTrainer
    """Reward of each validation prompt (mean over its `val_images` images). The noise of each batch
    of 8 prompts comes from VAL_SEED + its offset alone, so every run, variant and step sees the
    same noise: differences between them are paired (common random numbers)."""
    n, G = min(trainer.cfg.val_prompts, len(trainer.val_prompts)), trainer.cfg.val_images
    scores = []  # (first prompt, scores) of this process's batches; batch a goes to process (a / 8) mod W
    starts = list(range(0, n, 8))
    mine, rounds = trainer.engine.validation_share(starts)
    with trainer.ema.applied(trainer.policy) if trainer.ema else contextlib.nullcontext():  # the EMA weights, when on
        for i in range(rounds):
            a = mine[i] if i < len(mine) else starts[0]
            batch, images = validation_batch(
                trainer.policy,
                trainer.reward_fn,
                trainer.val_prompts,
                a,
                n,
                trainer.sampling,
                G,
                trainer.engine.precision,
            )
            if i >= len(mine):
                continue
            scores.append((a, batch))
            if a == 0 and trainer.accelerator.trackers:  # the first image of the first (up to 8) prompts
                log_image_grid(trainer.accelerator, "val/samples", images[::G], trainer.step)
    return [x for _, part in sorted(b for shares in trainer.engine.all_objects(scores) for b in shares) for x in part]
