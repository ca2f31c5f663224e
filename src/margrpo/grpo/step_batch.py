"""What one GRPO step carries between its phases: the rollout split into micro-batches with its advantages and
masks (`StepBatch`), the optimizer steps planned on it (`Update`), and the helpers that cut and combine them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from margrpo.grpo.rollout import Rollout


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
    ar: torch.Tensor  # [M] chosen AR steps
    diff: torch.Tensor  # [M, U] chosen diffusion steps
    mte_mask: torch.Tensor | None  # [K, N, L] M^k (Eq. 10)
    sim_keep: torch.Tensor | None  # [K, N, L] Sim keep-weights (Eq. 11)

    def micro_batch_mask(self, x: torch.Tensor | None, c: int) -> torch.Tensor | None:
        """A [K, N, L] mask restricted to micro-batch c's images."""
        return None if x is None else x[:, self.rows[c]]


@dataclass(frozen=True)
class OldLogProbs:
    """log_prob_old of a micro-batch at its chosen steps: the committed trajectory's [M, U, n, L] and MTE's extra
    trajectories' [M, S-1, U, n, L] (None without MTE)."""

    committed: torch.Tensor
    mte: torch.Tensor | None = None

    def steps(self, part: slice) -> OldLogProbs:
        """These log-probs at some of the chosen AR steps (a chunk of the replay)."""
        return OldLogProbs(self.committed[part], None if self.mte is None else self.mte[part])


@dataclass(frozen=True)
class TokenCounts:
    """The whole batch's loss-token counts at each chosen AR step [M], the denominators that make the micro-batch
    losses sum to the batch's token mean: the policy term's (Sim-weighted) and the KL's."""

    policy: torch.Tensor
    kl: torch.Tensor

    def steps(self, part: slice) -> TokenCounts:
        return TokenCounts(self.policy[part], self.kl[part])


@dataclass
class Update:
    """One optimizer step: chosen AR steps [M_u], diffusion steps [M_u, U], and log_prob_old per micro-batch
    (None: read off the update's own pass, the parameters being still those of the rollout)."""

    ar: torch.Tensor
    diff: torch.Tensor
    old: list[OldLogProbs | None]


def choose_steps(
    ar_steps: int, stochastic: int, mask_steps: int, diffusion_steps: int, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """|M| = mask_steps of the K = ar_steps AR steps and, for each, |T| = diffusion_steps of the
    stochastic diffusion steps, uniformly without replacement (DESIGN 3.3): [M] and [M, U], sorted."""
    ar = torch.randperm(ar_steps, generator=g)[:mask_steps].sort().values
    diff = torch.stack([torch.randperm(stochastic, generator=g)[:diffusion_steps].sort().values for _ in ar])
    return ar, diff


def subset_rollout(r: Rollout, rows: torch.Tensor) -> Rollout:
    """The rollout restricted to some images (micro-batch)."""

    def pick(x, dim):
        return None if x is None else x.index_select(dim, rows.to(x.device))

    return Rollout(
        prompts=[r.prompts[i] for i in rows.tolist()],
        latents=pick(r.latents, 0),
        images=pick(r.images, 0),
        orders=pick(r.orders, 0),
        known=pick(r.known, 1),
        committed=pick(r.committed, 1),
        states=pick(r.states, 2),
        log_probs=pick(r.log_probs, 2),
        cfg=r.cfg,
        sampling=r.sampling,
        mte_steps=r.mte_steps,
        mte_states=pick(r.mte_states, 3),
        mte_log_probs=pick(r.mte_log_probs, 3),
        full=r.full,
    )


def combine_chunk_stats(parts: list[tuple[float, int, float, dict]]) -> dict:
    """One micro-batch's stats from its chunks' (share, selected tokens, loss, stats): the loss terms add up
    by share, the ratio stats are token-weighted means (clip_frac, ratio_mean) and extremes (min, max)."""
    n = sum(sel for _, sel, _, _ in parts)
    out = {k: sum(sh * s[k] for sh, _, _, s in parts) for k in ("policy_loss", "kl")}
    for k in ("clip_frac", "ratio_mean"):
        out[k] = (
            sum(sel * s[k] for _, sel, _, s in parts if sel) / n if n else (0.0 if k == "clip_frac" else float("nan"))
        )
    for k, pick in (("ratio_min", min), ("ratio_max", max)):
        values = [s[k] for _, sel, _, s in parts if sel]
        out[k] = pick(values) if values else float("nan")
    return out
