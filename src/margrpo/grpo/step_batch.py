"""What one GRPO step carries between its phases: the rollout split into micro-batches with its advantages and
masks (`StepBatch`), the optimizer steps planned on it (`Update`), the backward passes of each (`Backward`), and
the helpers that cut and combine them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from margrpo.grpo.objective import consistency_mask, uncertainty_mask
from margrpo.grpo.replay import recorded
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
    ar_steps: torch.Tensor  # [M] the chosen AR steps
    diffusion_steps: torch.Tensor  # [M, U] the chosen diffusion steps of each
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
    """One optimizer step: chosen AR steps [M], diffusion steps [M, U], log_prob_old per micro-batch (None: read off
    the update's own pass, the parameters being still those of the rollout), and the whole batch's loss tokens."""

    ar_steps: torch.Tensor
    diffusion_steps: torch.Tensor
    old: list[OldLogProbs | None]
    tokens: torch.Tensor  # [M, U, N, L] float: the loss tokens of this process's images (loss_weights)
    counts: TokenCounts  # the loss tokens of every process's images, per chosen AR step


@dataclass(frozen=True)
class LossInputs:
    """What one micro-batch's loss reads (the trainer's `micro_loss`), by name: its images' sub-rollout and
    advantages, the chosen AR steps [m] and diffusion steps [m, U], MTE's M^k and Sim's keep-weights [K, n, L]
    (None: off), log_prob_old at these steps (None: read off this pass), and the whole batch's token counts (None:
    this rollout is the whole batch)."""

    rollout: Rollout
    adv: torch.Tensor  # [n]
    ar_steps: torch.Tensor
    diffusion_steps: torch.Tensor
    mte_mask: torch.Tensor | None = None
    sim_keep: torch.Tensor | None = None
    old: OldLogProbs | None = None
    counts: TokenCounts | None = None


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
    stochastic diffusion steps, uniformly without replacement (DESIGN 3.3): [M] and [M, U], sorted."""
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


def micro_batch_stats(done: list[tuple[Backward, float, dict]]) -> list[tuple[float, dict]]:
    """Each micro-batch's loss and stats from its backward passes' (backward, loss, stats): a chunked replay's
    chunks combine (`combine_chunk_stats`)."""
    out = []
    for c in sorted({part.index for part, _, _ in done}):
        parts = [(p.share, p.selected, loss, stats) for p, loss, stats in done if p.index == c]
        if len(parts) == 1:
            out.append((parts[0][2], parts[0][3]))
        else:
            out.append((sum(sh * v for sh, _, v, _ in parts), combine_chunk_stats(parts)))
    return out


def combine_chunk_stats(parts: list[tuple[float, int, float, dict]]) -> dict:
    """One micro-batch's stats from its chunks' (share, selected tokens, loss, stats): the loss terms add up
    by share, the ratio stats are token-weighted means (clip_frac, ratio_mean) and extremes (min, max)."""
    n = sum(sel for _, sel, _, _ in parts)
    out = {k: sum(sh * s[k] for sh, _, _, s in parts) for k in ("policy_loss", "kl")}
    for k in ("clip_frac", "ratio_mean"):
        out[k] = (
            sum(sel * s[k] for _, sel, _, s in parts if sel) / n if n else (0.0 if k == "clip_frac" else float("nan"))
        )
    for k, extreme in (("ratio_min", min), ("ratio_max", max)):
        values = [s[k] for _, sel, _, s in parts if sel]
        out[k] = extreme(values) if values else float("nan")
    return out


def variant_masks(
    rollout: Rollout, trajectories: int, top_frac: float, tau: float | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """MTE uncertainty masks M^m per AR step [K, N, L] (Eq. 10; empty at steps without extra trajectories; None
    when trajectories == 1) and Sim keep-weights per AR step [K, N, L] (Eq. 11; None when tau is None: no Sim)."""
    mte = None
    if trajectories > 1:
        finals = rollout.mte_finals()  # [M', S, N, L, D], index 0 the rollout's own sample at step m
        Mp, S, N, L, D = finals.shape
        per_step = uncertainty_mask(
            finals.transpose(0, 1).reshape(S, Mp * N, L, D), top_frac, rollout.mte_candidates().reshape(Mp * N, L)
        )  # top k% of each image's predicted tokens
        mte = torch.zeros_like(rollout.known)
        mte[rollout.mte_steps] = per_step.view(Mp, N, L)
    sim = None
    if tau is not None:
        x0, final, full = rollout.step_clean(), rollout.latents.float(), rollout.full_steps()  # x0: [K, N, L, D]
        keep = [
            torch.ones_like(rollout.committed[k])
            if k == 0 or not full[k - 1 : k + 1].all()  # untrained steps
            else consistency_mask(x0[k - 1], x0[k], final, rollout.committed[k], tau)
            for k in range(len(x0))
        ]
        sim = torch.stack(keep)
    return mte, sim


def loss_weights(
    completion: torch.Tensor, rollout: Rollout, ar_steps: torch.Tensor, sim_keep: torch.Tensor | None, loss_tokens: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which tokens each chosen (AR step, diffusion step) trains, [M, U, N, L] float: the KL's token mask (the
    completion mask, or its committed tokens) and the policy loss's weights (that mask times Sim's kappa)."""
    tokens = completion
    if loss_tokens == "committed":
        tokens = tokens & rollout.committed[ar_steps][:, None]
    tokens = tokens.float()
    weight = tokens if sim_keep is None else tokens * sim_keep[ar_steps][:, None].float()
    return tokens, weight


def update_columns(logs: list[dict]) -> dict:
    """A step's logged statistics from its updates' (`updates_per_rollout`): the last update's under the plain
    column names, and with several updates every one's also as u<i>/<column> (1-based)."""
    if len(logs) == 1:
        return logs[0]
    return {**logs[-1], **{f"u{i}/{k}": v for i, log in enumerate(logs, 1) for k, v in log.items()}}


def log_prob_old(
    replayed, old: OldLogProbs | None, rollout: Rollout, ar_steps, diffusion_steps, mte_mask, source: str
):
    """log_prob_old of a micro-batch's replay `replayed`: `old` when given, else the record's (`source` "recorded")
    or this pass's own, detached ("recomputed"); MTE's entries that were not replayed take the replay's own (ratio
    1, no gradient, never NaN)."""
    if old is None:
        if source == "recorded":
            old = OldLogProbs(*recorded(rollout, ar_steps, diffusion_steps))
        else:
            mte = None if replayed.mte_log_prob is None else replayed.mte_log_prob.detach()
            old = OldLogProbs(replayed.log_prob.detach(), mte)
    if mte_mask is not None and old.mte is not None:
        mte = torch.where(mte_mask[ar_steps][:, None, None], old.mte, replayed.mte_log_prob.detach())
        old = OldLogProbs(old.committed, mte)
    return old


def update_log(stats: list[dict], kl: str, batch: StepBatch, update: Update, all_sum, **columns) -> dict:
    """An update's statistics over every process's micro-batches `stats` (means, the loss terms' sums, ratio
    extremes), then `columns` (norms, the guard's verdict), then the share of MTE's tokens (`all_sum`: over the
    processes)."""
    log = {k: float(torch.tensor([s[k] for s in stats]).nanmean()) for k in stats[0]}
    log.update({k: sum(s[k] for s in stats) for k in ("policy_loss", "kl")})  # shares of the batch loss
    log.update(ratio_min=min(s["ratio_min"] for s in stats), ratio_max=max(s["ratio_max"] for s in stats))
    if kl == "paper":  # Eq. 14 on the means' differences (not a KL divergence): named for what it is
        log = {("kl_paper" if k == "kl" else k): v for k, v in log.items()}
    log.update(columns)
    if batch.mte_mask is not None:  # the share of the loss tokens that Eq. 10 averages over S trajectories
        tokens = update.tokens
        share = all_sum(torch.stack([(batch.mte_mask[update.ar_steps][:, None] * tokens).sum(), tokens.sum()]))
        log["mte_frac"] = float(share[0] / share[1].clamp(min=1))
    return log
