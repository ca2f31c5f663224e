"""Claim b along training: the AR part's batch-gradient noise at the ladder's saved checkpoints, +Fix against GRPO.

Input: one `batches.json` per (variant, seed, checkpoint step) from rule `checkpoint_gradient` (the AR part's batch
gradient, +Fix's estimator, at that run's policy; GRPO's AR gradient equals +Fix's for one policy), all over the
base's first B batch seeds, so every policy sees the same prompts and noise; step 0 is the base's own +Fix batches
(rule `gradient_estimator`), shared by every variant and seed. Per point: the noise tr Cov g and the mean batch
gradient norm mean |g_b| (reporting.estimators' statistics, unbiased on resamples).

The paper's Fig. 2a reads the AR gradient's norm and variance over training; claim b says the frozen head lowers
them. Here its ratio +Fix / GRPO is the geometric mean over seeds and checkpoints of the two variants' statistic at
the same seed and step (paired: one seed's two runs share their data order and start), with a paired bootstrap
that resamples the seeds and, shared by every policy, the batch seeds.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from margrpo.infra.files import atomic_save_figure, atomic_write_csv, atomic_write_text
from margrpo.reporting.estimators import LABELS, N_BOOT, Batches, bc_interval, noise
from margrpo.reporting.paired import ratio_verdict
from margrpo.reporting.tables import VARIANT_LABELS

STATISTICS = {"noise": ("noise tr Cov g", "tr Cov g ratio"), "norm": ("mean |g|", "mean batch-gradient norm ratio")}
PAIR = ("fix", "grpo")  # the claim's ratio: +Fix / GRPO
CHECKPOINT_NOTE = (
    "Claim b has two instruments. The per-step probe (`grad_norm_ar`, `grad_var_ar`: the spread of the AR gradient "
    "across one step's micro-batches, logged at every step, t over seeds) and the batch gradient at trained "
    "checkpoints (report/checkpoint_gradients.md: the AR part's gradient over the same batch seeds at each ladder "
    "seed's saved checkpoints, +Fix / GRPO paired by seed and step, bootstrap over seeds and batch seeds)."
)


def mean_norm(b: Batches) -> float:
    """The mean norm of the batch gradients, mean |g_b| (Fig. 2a's AR gradient norm, per batch)."""
    return float(np.sqrt(np.clip(np.diag(b.gram), 0, None)).mean())


STAT_FNS = {"noise": noise, "norm": mean_norm}


def batches_path(folder: str, variant: str, seed: int, step: int) -> str:
    """A checkpoint's batches, relative to the results root (rule checkpoint_gradient's output)."""
    return f"{folder}/checkpoints/{variant}/seed{seed}/step{step}/fix/batches.json"


@dataclass
class CheckpointGradients:
    points: pd.DataFrame  # one row per (variant, seed, step), step 0 the base
    ratios: pd.DataFrame  # +Fix / GRPO per statistic: each checkpoint step and all of them pooled
    claims: list[dict]
    block: str
    batches: int
    confidence: float

    def to_markdown(self) -> str:
        steps = sorted(self.points["step"].unique())
        out = [
            f"**The AR gradient at trained checkpoints ({self.block}).** The AR part's batch gradient (+Fix's "
            f"estimator) over the same {self.batches} batch seeds at the ladder runs' checkpoints; step 0 is the "
            "base. `noise` is tr Cov g, `|g|` the mean batch-gradient norm; each cell the geometric mean over seeds "
            "(each seed's value in points below).",
            "",
            "| variant | " + " | ".join(f"step {s}: noise, \\|g\\|" for s in steps) + " |",
            "|:---|" + "---:|" * len(steps),
        ]
        for variant, rows in self.points.groupby("variant", sort=False):
            cells = []
            for s in steps:
                at = rows[rows["step"] == s]
                cells.append(f"{_geomean(at['noise']):.3g}, {_geomean(at['norm']):.3g}")
            out.append(f"| {VARIANT_LABELS.get(variant, variant)} | " + " | ".join(cells) + " |")
        out += [
            "",
            f"+Fix / GRPO, paired by seed and step ({self.confidence:.0%} interval: bootstrap over seeds and batch "
            "seeds):",
            "",
            "| statistic | checkpoints | ratio [CI] | per seed |",
            "|:---|:---|:---|:---|",
        ]
        for r in self.ratios.to_dict("records"):
            out.append(
                f"| {STATISTICS[r['statistic']][0].replace('|', chr(92) + '|')} | {r['steps']} | "
                f"{r['ratio']:.3f}x [{r['lo']:.3f}, {r['hi']:.3f}] "
                f"| {r['per_seed']} |"
            )
        out += ["", "Claims:", "", "| claim | statement | effect | CI | verdict |", "|:---|:---|---:|:---|:---|"]
        for c in self.claims:
            out.append(
                f"| {c['claim']} | {c['statement']} | {c['diff']:.3f}x | [{c['lo']:.3f}, {c['hi']:.3f}] | "
                f"**{c['verdict']}** |"
            )
        return "\n".join(out) + "\n"

    def figure(self):
        """Noise and mean |g| against the training step: a thin line per seed, the geometric mean thick."""
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, stat in zip(axes, STATISTICS):
            for i, (variant, rows) in enumerate(self.points.groupby("variant", sort=False)):
                colour = f"C{i}"
                for _, seed_rows in rows.groupby("seed"):
                    seed_rows = seed_rows.sort_values("step")
                    ax.plot(seed_rows["step"], seed_rows[stat], color=colour, lw=0.8, alpha=0.35)
                mean = rows.groupby("step")[stat].apply(_geomean)
                label = VARIANT_LABELS.get(variant, variant)
                ax.plot(mean.index, mean.values, "o-", color=colour, lw=2.2, label=label)
            ax.set(xlabel="training step (0: the base)", ylabel=STATISTICS[stat][0])
            ax.set_xticks(sorted(self.points["step"].unique()))
            ax.legend(fontsize=8)
        pooled = self.ratios.groupby("statistic").last()  # each statistic's last row pools every checkpoint
        for ax, stat in zip(axes, STATISTICS):
            if stat in pooled.index:
                r = pooled.loc[stat]
                ax.set_title(
                    f"AR {STATISTICS[stat][0]}: +Fix / GRPO {r['ratio']:.2f}x [{r['lo']:.2f}, {r['hi']:.2f}]",
                    fontsize=9,
                )
        fig.suptitle(f"The AR batch gradient along training ({self.block}, {self.batches} batch seeds)", fontsize=10)
        fig.tight_layout()
        return fig

    def write(self, prefix: str | os.PathLike, formats=("png", "pdf")) -> list[Path]:
        prefix = os.fspath(prefix)
        paths = [
            atomic_write_csv(self.points, f"{prefix}.csv"),
            atomic_write_csv(self.ratios, f"{prefix}_ratios.csv"),
            atomic_write_text(f"{prefix}.md", self.to_markdown()),
        ]
        figure = self.figure()
        paths += atomic_save_figure(figure, os.path.join(os.path.dirname(prefix), "fig_checkpoint_gradients"), formats)
        import matplotlib.pyplot as plt

        plt.close(figure)
        return paths


def _geomean(values) -> float:
    v = np.asarray(values, dtype=np.float64)
    return float(np.exp(np.log(v).mean())) if len(v) and (v > 0).all() else math.nan


def read_points(root: Path, blk: dict) -> dict[tuple[str, int, int], Batches]:
    """Every (variant, seed, step)'s batches, the base's first B +Fix batches as step 0 of each."""
    c = blk["checkpoints"]
    B = c["batches"]
    path = root / blk["dir"] / "fix" / "batches.json"
    base = Batches.read(path)
    if len(base) < B:
        raise ValueError(f"{path}: {len(base)} batch seeds, the checkpoints use {B}")
    base = base.take(np.arange(B))
    points = {}
    for variant in c["variants"]:
        for seed in c["seeds"]:
            points[variant, seed, 0] = base
            for step in c["steps"]:
                path = root / batches_path(blk["dir"], variant, seed, step)
                b = Batches.read(path)
                if len(b) != B:
                    raise ValueError(f"{path}: {len(b)} batch seeds, experiments.estimators.checkpoints says {B}")
                points[variant, seed, step] = b
    return points


def paired_checkpoint_ratio(
    points, stat, seeds: list[int], steps: list[int], confidence: float, n_boot: int = N_BOOT, seed=0
):
    """Geometric mean over `seeds` x `steps` of stat(+Fix) / stat(GRPO) at the same seed and step, and its
    bias-corrected bootstrap interval: seeds resampled, and the batch seeds once for every policy of a draw.
    Returns (value, lo, hi, per-seed ratios)."""
    fix, grpo = PAIR
    B = len(points[fix, seeds[0], steps[0]])

    def value(seed_draw, idx) -> float:
        logs = []
        for s in seed_draw:
            for t in steps:
                a, b = stat(points[fix, s, t].take(idx)), stat(points[grpo, s, t].take(idx))
                if not (a > 0 and b > 0):
                    return math.nan
                logs.append(math.log(a / b))
        return math.exp(sum(logs) / len(logs))

    every = np.arange(B)
    point = value(seeds, every)
    per_seed = {s: value([s], every) for s in seeds}
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        seed_draw = [seeds[i] for i in rng.integers(0, len(seeds), len(seeds))]
        draws.append(value(seed_draw, rng.integers(0, B, B)))
    draws = np.array(draws)
    lo, hi = bc_interval(point, draws, confidence, n_boot)
    return point, lo, hi, per_seed


def checkpoint_gradients(root: str | Path, spec: dict, confidence: float = 0.95) -> CheckpointGradients:
    """``spec = {"blocks": [{"policy", "reward", "dir", "checkpoints": {"variants", "steps", "batches", "seeds"}}]}``
    (rules/common.smk's estimator_block); the first block with checkpoints."""
    blocks = [b for b in spec.get("blocks") or [] if b.get("checkpoints")]
    if not blocks:
        raise ValueError("report checkpoint-gradients: the runs JSON needs a block with 'checkpoints'")
    blk, root = blocks[0], Path(root)
    c = blk["checkpoints"]
    points = read_points(root, blk)
    table = pd.DataFrame(
        [
            {"variant": v, "seed": s, "step": t, "batches": len(b), "noise": noise(b), "norm": mean_norm(b)}
            for (v, s, t), b in points.items()
        ]
    )
    ratios, claims = [], []
    name = f"{blk['policy']} / {blk['reward']}"
    if all(v in c["variants"] for v in PAIR):
        steps = sorted(c["steps"])
        for stat in STATISTICS:
            for which in [[t] for t in steps] + ([steps] if len(steps) > 1 else []):
                r, lo, hi, per_seed = paired_checkpoint_ratio(
                    points, STAT_FNS[stat], list(c["seeds"]), which, confidence
                )
                label = "all" if len(which) > 1 else str(which[0])
                ratios.append(
                    {
                        "statistic": stat,
                        "steps": label,
                        "ratio": r,
                        "lo": lo,
                        "hi": hi,
                        "n_seeds": len(c["seeds"]),
                        "per_seed": ", ".join(f"{s}: {v:.3f}" for s, v in per_seed.items()),
                    }
                )
                if which == steps:  # the claim pools every checkpoint
                    claims.append(_claim_row(name, stat, steps, ratios[-1], len(points[PAIR[0], c["seeds"][0], 0])))
    return CheckpointGradients(table, pd.DataFrame(ratios), claims, name, c["batches"], confidence)


def _claim_row(block: str, stat: str, steps: list[int], r: dict, batches: int) -> dict:
    what = "noise (tr Cov g)" if stat == "noise" else "norm"
    at = ", ".join(str(s) for s in steps)
    return {
        "block": block,
        "claim": "b",
        "statement": f"AR batch-gradient {what} lower with the frozen head, at trained checkpoints (steps {at})",
        "metric": f"{STATISTICS[stat][1]} (geometric mean over seeds and checkpoints; {batches} batch seeds)",
        "comparison": f"{LABELS['fix']} / GRPO",
        "n_seeds": r["n_seeds"],
        "diff": r["ratio"],
        "ci": "paired bootstrap over seeds and batch seeds",
        "lo": r["lo"],
        "hi": r["hi"],
        "verdict": ratio_verdict(r["lo"], r["hi"], -1),
        "t_lo": math.nan,
        "t_hi": math.nan,
        "boot_lo": r["lo"],
        "boot_hi": r["hi"],
        "per_seed": r["per_seed"],
    }
