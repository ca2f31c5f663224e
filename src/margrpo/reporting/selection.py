"""Which checkpoint a run reports (design.md §3.12).

Baselines (GRPO*, +Fix*) report the checkpoint with the best validation reward, as the paper
does (marked * in the tables); the full method reports a step fixed in the config before
training. Validation prompts are disjoint from the evaluation prompts, so choosing by them does
not peek at the reported numbers. Pure functions over the parsed ``summary.json``.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["SELECTION_RULES", "parse_step", "select_checkpoint"]

SELECTION_RULES = ("best", "fixed")


def parse_step(step: str | int) -> str | int:
    """``"best"`` and ``"last"`` stay as they are; an integer (or its string) becomes an int >= 0."""
    if isinstance(step, str) and step.strip().lower() in ("best", "last"):
        return step.strip().lower()
    try:
        value = int(step)
    except (TypeError, ValueError):
        raise ValueError(f"step must be 'best', 'last' or a checkpoint step (an integer), got {step!r}") from None
    if value < 0:
        raise ValueError(f"step must be >= 0, got {value}")
    return value


def _candidates(summary: dict[str, Any]) -> list[dict[str, Any]]:
    ckpts = summary.get("checkpoints")
    if not ckpts:
        where = summary.get("run_dir", "this run")
        raise ValueError(f"summary of {where} lists no checkpoints; nothing to select (did training save any?)")
    out = []
    for c in ckpts:
        val = c.get("val_reward")
        val = math.nan if val is None else float(val)
        out.append({"step": int(c["step"]), "path": str(c["path"]), "val_reward": val})
    return sorted(out, key=lambda c: c["step"])


def select_checkpoint(summary: dict[str, Any], step: str | int) -> dict[str, Any]:
    """Choose the checkpoint to report from a training ``summary``.

    Args:
        summary: parsed ``summary.json`` with ``checkpoints: [{step, path, val_reward}, ...]``.
        step: ``"best"`` -> the highest finite validation reward, ties to the earliest step;
            ``"last"`` -> the run's last checkpoint (fixed in advance, whatever the run's length);
            an integer -> exactly that checkpoint (error naming the available steps otherwise).

    Returns:
        ``{"policy", "step", "rule" ("best" | "fixed"), "val_reward", "candidates"}`` plus the
        run's ``run_dir`` / ``variant`` / ``base_val_reward`` when the summary has them.
    """
    step = parse_step(step)
    cands = _candidates(summary)
    if step == "best":
        scored = [c for c in cands if math.isfinite(c["val_reward"])]
        if not scored:
            raise ValueError(
                f"no checkpoint has a finite validation reward (steps {[c['step'] for c in cands]}); "
                "cannot select 'best' — check val_every / save_every in the grpo config"
            )
        # max() keeps the first maximum; candidates are sorted by step, so ties go to the earliest.
        chosen, rule = max(scored, key=lambda c: c["val_reward"]), "best"
    elif step == "last":
        chosen, rule = max(cands, key=lambda c: c["step"]), "fixed"
    else:
        matches = [c for c in cands if c["step"] == step]
        if not matches:
            raise ValueError(
                f"no checkpoint at step {step}; available steps: {[c['step'] for c in cands]}. "
                "Set the variant's report_step to one of them (a multiple of save_every, or the last step)."
            )
        chosen, rule = matches[0], "fixed"
    out: dict[str, Any] = {
        "policy": chosen["path"],
        "step": chosen["step"],
        "rule": rule,
        "val_reward": chosen["val_reward"],
        "candidates": cands,
    }
    for key in ("run_dir", "variant", "base_val_reward"):
        if key in summary:
            out[key] = summary[key]
    return out
