"""What one GRPO step plans and carries between its phases: the rollout split into micro-batches with its advantages
and masks (`StepBatch`), the optimizer steps planned on it (`Update`) and the backward passes of each (`Backward`).
The loss they feed is grpo.variants'; the statistics they log combine in grpo.step_stats."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from margrpo.grpo.rollout import Rollout
from margrpo.grpo.variants import LossInputs, OldLogProbs, TokenCounts


@dataclass
class StepBatch:
    """One step's rollout, split into micro-batches, and what the loss needs from it."""

    rollout: Rollout
    subs: list[Rollout]  # the rollout restricted to each micro-batch's images
    rows: tuple[torch.Tensor, ...]  # each micro-batch's image indices
    rewards: torch.Tensor  # [N]
    components: dict[str, torch.Tensor]  # each reward term [N], for logging
    adv: torch.Tensor  # [N] group advantages
    frac_zero: float  # share of groups whose rewards have zero spread
    ar_steps: torch.Tensor  # [M] the chosen AR steps
    diffusion_steps: torch.Tensor  # [M, U] the chosen diffusion steps of each
    mte_mask: torch.Tensor | None  # [K, N, L] M^k (Eq. 10)
    sim_keep: torch.Tensor | None  # [K, N, L] Sim keep-weights (Eq. 11)

    def micro_batch_mask(self, x: torch.Tensor | None, c: int) -> torch.Tensor | None:
        """A [K, N, L] mask restricted to micro-batch c's images."""
        return None if x is None else x[:, self.rows[c]]


@dataclass
class Update:
    """One optimizer step: chosen AR steps [M], diffusion steps [M, U], log_prob_old per micro-batch (None: read off
    the update's own pass, the parameters being still those of the rollout), and the whole batch's loss tokens."""

    ar_steps: torch.Tensor
    diffusion_steps: torch.Tensor
    old: list[OldLogProbs | None]
    tokens: torch.Tensor  # [M, U, N, L] float: the loss tokens of this process's images (loss_weights)
    counts: TokenCounts  # the loss tokens of every process's images, per chosen AR step


@dataclass(frozen=True)
class Backward:
    """One backward pass of an update: micro-batch `index`'s images at a chunk of the chosen AR steps
    (`grpo.replay_chunk`), with what its loss reads, and its share of the micro-batch's loss."""

    index: int  # the micro-batch
    inputs: LossInputs  # the chunk's: its steps, their log_prob_old and the batch's token counts there
    share: float  # of the micro-batch's loss: the chunk's steps' share of the mean (1 under reinforce)
    selected: int  # loss tokens of the chunk (weigh its ratio stats when chunks combine)
    last_chunk: bool
    last_micro_batch: bool


def choose_steps(
    ar_steps: int, stochastic: int, mask_steps: int, diffusion_steps: int, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """|M| = mask_steps of the K = ar_steps AR steps and, for each, |T| = diffusion_steps of the
    stochastic diffusion steps, uniformly without replacement (design.md §3.3): [M] and [M, U], sorted."""
    ar = torch.randperm(ar_steps, generator=g)[:mask_steps].sort().values
    diff = torch.stack([torch.randperm(stochastic, generator=g)[:diffusion_steps].sort().values for _ in ar])
    return ar, diff


def subset_rollout(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """The rollout restricted to some images (micro-batch)."""

    def rows_of(x, dim):
        return None if x is None else x.index_select(dim, rows.to(x.device))

    return Rollout(
        prompts=[rollout.prompts[i] for i in rows.tolist()],
        latents=rows_of(rollout.latents, 0),
        images=rows_of(rollout.images, 0),
        orders=rows_of(rollout.orders, 0),
        known=rows_of(rollout.known, 1),
        committed=rows_of(rollout.committed, 1),
        states=rows_of(rollout.states, 2),
        log_probs=rows_of(rollout.log_probs, 2),
        cfg=rollout.cfg,
        sampling=rollout.sampling,
        mte_steps=rollout.mte_steps,
        mte_states=rows_of(rollout.mte_states, 3),
        mte_log_probs=rows_of(rollout.mte_log_probs, 3),
        full=rollout.full,
    )
