"""A GRPO step's logged statistics, combined from its backward passes, micro-batches, processes and updates."""

from __future__ import annotations

import torch

from margrpo.grpo.step_plan import Backward, StepBatch, Update


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


def update_columns(logs: list[dict]) -> dict:
    """A step's logged statistics from its updates' (`updates_per_rollout`): the last update's under the plain
    column names, and with several updates every one's also as u<i>/<column> (1-based)."""
    if len(logs) == 1:
        return logs[0]
    return {**logs[-1], **{f"u{i}/{k}": v for i, log in enumerate(logs, 1) for k, v in log.items()}}


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
