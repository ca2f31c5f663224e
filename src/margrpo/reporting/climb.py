"""The climbing ladder's figure: validation reward against step, each rung beside its shuffled-advantage control.

A run alone rises or falls with its prompts and its random walk; the control (the same seeds, base and validation
noise, its advantages shuffled: update noise without credit) shows what that alone does, so the gap between the two
is what the rung learned (docs/findings.md, "RL is seen to climb").

    climb(root, {"runs": [train/... runs], "variants": [...], "control": "control"}) -> Figure
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from margrpo.reporting.figures import _band, _label, variant_colors
from margrpo.reporting.results import aggregate_seeds, load_metrics, load_summary, mean_ci, parse_run
from margrpo.reporting.tables import VARIANT_LABELS

__all__ = ["climb", "final_lift"]


def final_lift(frames: dict[int, pd.DataFrame], control: dict[int, pd.DataFrame], confidence: float) -> tuple:
    """(mean, half-width, n) over the seeds both have of the last validated reward minus the control's."""
    diffs = []
    for seed in sorted(set(frames) & set(control)):
        a, b = (f[["step", "val_reward"]].dropna() for f in (frames[seed], control[seed]))
        if len(a) and len(b):
            diffs.append(float(a["val_reward"].iloc[-1]) - float(b["val_reward"].iloc[-1]))
    return mean_ci(diffs, confidence)


def _with_base(root: str | Path, run: str) -> pd.DataFrame:
    """A run's validation rewards by step, the base policy's (summary.json, the same prompts and noise) at step 0."""
    val = load_metrics(root, run)[["step", "val_reward"]].dropna()
    base = load_summary(root, run).get("base_val_reward")
    if base is None or 0 in set(val["step"]):
        return val
    return pd.concat([pd.DataFrame({"step": [0], "val_reward": [float(base)]}), val], ignore_index=True)


def climb(root: str | Path, spec: dict, confidence: float = 0.95) -> Figure:
    """One panel per rung and (policy, reward) block: the rung's validation reward over steps and the control's,
    mean and t-band over seeds; the title gives the rung's lift over the control at the last step."""
    runs = [parse_run(r) for r in spec.get("runs") or []]
    if not runs:
        raise ValueError("report fig-climb: the runs JSON lists no runs")
    control = spec.get("control") or "control"
    variants = [v for v in spec.get("variants") or dict.fromkeys(r.variant for r in runs) if v != control]
    blocks = list(dict.fromkeys((r.policy, r.reward) for r in runs))
    colors = variant_colors(variants + [control])
    colors[control] = "#000000"
    frames = {r.run: _with_base(root, r.run) for r in runs}

    def by_seed(policy: str, reward: str, variant: str) -> dict[int, pd.DataFrame]:
        return {r.seed: frames[r.run] for r in runs if (r.policy, r.reward, r.variant) == (policy, reward, variant)}

    rows = [(p, r, [v for v in variants if by_seed(p, r, v)]) for p, r in blocks]
    ncols = max(len(vs) for *_, vs in rows) or 1
    fig = Figure(figsize=(3.4 * ncols, 3.0 * len(rows) + 0.6), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(rows), ncols, squeeze=False, sharey="row"))
    for (policy, reward, rungs), row in zip(rows, axes):
        ctrl = by_seed(policy, reward, control)
        for ax, v in zip(row, rungs):
            seeds = by_seed(policy, reward, v)
            picked = [r.run for r in runs if (r.policy, r.reward, r.variant) == (policy, reward, v)]
            label = _label(v, root, picked)
            _band(ax, aggregate_seeds(list(seeds.values()), "val_reward", confidence), "step", colors[v], label, "o")
            if ctrl:
                agg = aggregate_seeds(list(ctrl.values()), "val_reward", confidence)
                _band(ax, agg, "step", colors[control], VARIANT_LABELS.get(control, control), "s")
                mean, half, n = final_lift(seeds, ctrl, confidence)
                lift = f"{mean:+.3f}" + (f" ± {half:.3f}" if math.isfinite(half) else "") + f" ({n} seeds)"
                ax.set_title(f"{label}: lift over the control\n{lift}", fontsize="medium")
            else:
                ax.set_title(f"{label} (no control run)", fontsize="medium")
            ax.set_xlabel("training step (0: the base)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small", loc="best")
        row[0].set_ylabel(f"validation reward\n{policy}, {reward}")
        for ax in row[len(rungs) :]:
            ax.axis("off")
    fig.suptitle(
        f"RL climbs: each rung against the shuffled-advantage control (mean, {confidence:.0%} t-band over seeds)"
    )
    return fig
