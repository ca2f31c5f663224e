"""The paper's figures from result files (matplotlib, Agg; no pyplot state).

Each public builder takes the results root and the JSON spec its Snakemake rule passes and
returns a ``matplotlib.figure.Figure``; ``margrpo.infra.files.atomic_save_figure`` writes it:

    dynamics          Fig. 2a/2b, Fig. 5  gradient norm / variance, val + train reward, KL vs step
    uncertainty       Fig. 4              samples beside their per-token MTE uncertainty
    samples           Fig. 6              the same prompts across Base and the ladder (seed 0)
    ablation_samples  Fig. 7a             samples per ablation point (k, tau, S)
    ablation_curves   Fig. 7b             smoothed training reward per k
    ablation_final    Fig. 7c             final CompBench / preference score vs k, tau and S

The ladder's variants keep one colour everywhere (``VARIANT_COLORS``; base grey); other variants take
spare colours, no two alike (``variant_colors``). Curves are the mean over seeds with a shaded
t-interval band; points carry t-interval error bars where there are seeds.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import hsv_to_rgb, to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402  (after the Agg backend is chosen)

from margrpo.reporting.results import (  # noqa: E402
    ABLATION_SYMBOLS,
    RunId,
    aggregate_seeds,
    eval_scores,
    list_samples,
    load_metrics,
    load_selection,
    load_summary,
    load_uncertainty,
    mean_ci,
    parse_run,
    sample_image,
)
from margrpo.reporting.tables import VARIANT_LABELS  # noqa: E402

__all__ = [
    "VARIANT_COLORS",
    "variant_colors",
    "variant_color",
    "dynamics",
    "uncertainty",
    "samples",
    "ablation_samples",
    "ablation_curves",
    "ablation_final",
    "plot_dynamics",
    "plot_uncertainty",
    "plot_sample_grid",
]

# Okabe–Ito colour-blind-safe palette for the ladder (committed beside +Fix's blue, as its variant of it); base grey.
VARIANT_COLORS = {
    "base": "#7f7f7f",
    "grpo": "#D55E00",
    "fix": "#0072B2",
    "mte": "#009E73",
    "sim": "#CC79A7",
    "committed": "#56B4E9",
    "head": "#E69F00",
}
# for other variants, in the order a figure lists them: Okabe–Ito's black, then tab10 without its grey (the base's)
_EXTRA_COLORS = [
    "#000000",
    "#8c564b",
    "#9467bd",
    "#bcbd22",
    "#17becf",
    "#d62728",
    "#e377c2",
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
]


def variant_colors(variants: Sequence[str]) -> dict[str, str]:
    """A colour per variant, none shared: the ladder's fixed ones (the same in every figure), then the spare
    colours in the given order (config order: stable for a config), then golden-angle hues for any number more."""
    used = {VARIANT_COLORS[v] for v in variants if v in VARIANT_COLORS}
    spare = (c for c in _EXTRA_COLORS if c not in used)
    colors, hue = {}, 0.0
    for v in dict.fromkeys(variants):
        if v in VARIANT_COLORS:
            colors[v] = VARIANT_COLORS[v]
            continue
        color = next(spare, None)
        while color is None or color in used:
            hue = (hue + 0.618033988749895) % 1.0
            color = to_hex(hsv_to_rgb((hue, 0.75, 0.75)))
        colors[v] = color
        used.add(color)
    return colors


def variant_color(variant: str) -> str:
    """The variant's colour on its own (the ladder's fixed one; an unknown variant gets the first spare):
    a figure of several unknown variants takes ``variant_colors`` of them all."""
    return variant_colors([variant])[variant]


def _label(variant: str, root: str | Path | None = None, runs: Sequence[str] = ()) -> str:
    """Paper label of a variant, with * when every run's selection.json (if present) says `best`."""
    label = VARIANT_LABELS.get(variant, variant)
    if root is not None and runs:
        sels = [load_selection(root, r, required=False) for r in runs]
        if sels and all(s is not None and s.get("rule") == "best" for s in sels):
            label += "*"
    return label


def _fmt(value: float) -> str:
    return f"{value:g}"


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(str(text), width=width)) or str(text)


def _band(
    ax, agg: pd.DataFrame, x: str, color: str, label: str, marker: str | None = None, floor: float | None = None
):
    """Mean line with a shaded CI band (where the CI is defined), cut at `floor` for quantities that cannot go
    below it."""
    ax.plot(agg[x], agg["mean"], color=color, label=label, marker=marker, lw=1.6, ms=3)
    ci = agg["ci"].to_numpy(dtype=float)
    ok = np.isfinite(ci)
    if ok.any():
        low = (agg["mean"] - agg["ci"])[ok]
        ax.fill_between(
            agg[x][ok],
            low if floor is None else low.clip(lower=floor),
            (agg["mean"] + agg["ci"])[ok],
            color=color,
            alpha=0.18,
            lw=0,
        )


def _no_data(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"{what}\nnot logged", ha="center", va="center", transform=ax.transAxes, color="0.4")


# --------------------------------------------------------------------------------------------
# Fig. 2 / Fig. 5: training dynamics
# --------------------------------------------------------------------------------------------

# metrics.csv column, panel title, y label, log y, lower bound of the quantity (for the CI band), whose runs it
# draws ("ar": those that train the AR, "head": those whose AR is frozen, None: all)
DYNAMICS_PANELS = [
    ("grad_norm_ar", "AR gradient norm", "L2 norm of AR-parameter gradient", False, 0.0, "ar"),
    ("grad_var_ar", "AR gradient variance", "variance across micro-batches (log)", True, None, "ar"),
    ("val_reward", "Validation reward", "mean reward, validation prompts", False, None, None),
    ("reward_mean", "Training reward", "mean reward, rollout batch", False, None, None),
    ("kl", "KL term to the reference", "Eq. 14 or Gaussian KL per token (log)", True, None, None),
]
# with the AR frozen (freeze_ar, the `head` variant) the trainer logs its head's gradient under the same columns
# (GRPOTrainer.stat_params): a norm over other parameters, so on axes of its own, beside the AR's
HEAD_GRAD_PANELS = [
    ("grad_norm_ar", "Head gradient norm (AR frozen)", "L2 norm of diffusion-head gradient", False, 0.0, "head"),
    ("grad_var_ar", "Head gradient variance (AR frozen)", "variance across micro-batches (log)", True, None, "head"),
]


class Series(NamedTuple):
    """One variant's line in each panel. ``head_grads``: its logged gradient statistics are the diffusion head's
    (its AR is frozen), drawn in the head's panels and left out of the AR's."""

    label: str
    color: str
    frames: Sequence[pd.DataFrame]  # per-seed metrics frames
    head_grads: bool = False


def _dynamics_panel(ax, panel: tuple, series: Sequence[Series], confidence: float, title: str) -> None:
    col, _, ylabel, logy, floor, grads = panel
    drawn = False
    for s in series:
        if grads is not None and s.head_grads != (grads == "head"):
            continue
        agg = aggregate_seeds(s.frames, col, confidence)
        if logy:
            agg = agg[agg["mean"] > 0]
        if len(agg):
            _band(ax, agg, "step", s.color, s.label, marker="o" if col == "val_reward" else None, floor=floor)
            drawn = True
    if not drawn:
        if grads == "head" and not any(s.head_grads for s in series):
            ax.text(
                0.5, 0.5, "no run with\nthe AR frozen", ha="center", va="center", transform=ax.transAxes, color="0.4"
            )
        else:
            _no_data(ax, col)
    if logy and drawn:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step (optimizer updates)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def _legend_entries(axes, order: Sequence[str] = ()) -> tuple[list, list[str]]:
    """(handles, labels) over all panels, each label once: a series missing from one panel still appears.
    Labels in ``order`` come first, in that order (a head-only run's first panel is not the first)."""
    entries = {}
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(lab, h)
    rank = {lab: i for i, lab in enumerate(dict.fromkeys(order))}
    labels = sorted(entries, key=lambda lab: rank.get(lab, len(rank)))  # stable: the rest as found
    return [entries[lab] for lab in labels], labels


def _panels(series: Sequence[Series]) -> list[tuple]:
    """The AR's gradient panels when a run trains the AR, the head's when one freezes it, then the rest."""
    ar, head = any(not s.head_grads for s in series), any(s.head_grads for s in series)
    grads = [p for p in DYNAMICS_PANELS if p[5] == "ar"] * ar + HEAD_GRAD_PANELS * head
    return grads + [p for p in DYNAMICS_PANELS if p[5] is None]


def plot_dynamics(blocks: Sequence[tuple[str, Sequence[Series | tuple]]], confidence: float) -> Figure:
    """``blocks``: (policy / reward title, its series). One block: the panels of Fig. 2 / Fig. 5 in two rows
    with the legend; several: one row of the panels per block, so each block's variants are compared on their own."""
    blocks = [(title, [Series(*s) for s in series]) for title, series in blocks]
    everything = [s for _, series in blocks for s in series]
    panels = _panels(everything)
    n_seeds = max(len(s.frames) for s in everything)
    band = f"shaded: {confidence:.0%} t-interval over seeds" if n_seeds > 1 else "one seed per variant"
    legend_title = f"variant (mean over seeds; {band})"
    frozen = list(dict.fromkeys(s.label for s in everything if s.head_grads))
    if frozen:  # said where the AR panels lack them
        legend_title += f"\n{', '.join(frozen)}: AR frozen, gradient in the Head panels"
    if len(blocks) == 1:
        ncols = 3 if len(panels) < 6 else 4
        fig = Figure(figsize=(4.3 * ncols, 7.2), layout="constrained")
        axes = fig.subplots(math.ceil((len(panels) + 1) / ncols), ncols).ravel()
        for ax, panel in zip(axes, panels):
            _dynamics_panel(ax, panel, blocks[0][1], confidence, panel[1])
        for ax in axes[len(panels) :]:
            ax.axis("off")
        handles, labels = _legend_entries(axes, [s.label for s in everything])
        axes[-1].legend(
            handles,
            labels,
            loc="center",
            title=legend_title.replace(" (", "\n(", 1),
            frameon=False,
            ncols=math.ceil(len(labels) / 10),
            fontsize="medium" if len(labels) <= 10 else "small",
        )
    else:
        fig = Figure(figsize=(3.3 * len(panels), 2.7 * len(blocks) + 0.9 + 0.3 * bool(frozen)), layout="constrained")
        axes = fig.subplots(len(blocks), len(panels), squeeze=False)
        for row, (block, series) in zip(axes, blocks):
            for ax, panel in zip(row, panels):
                _dynamics_panel(ax, panel, series, confidence, f"{panel[1]}\n{block}")
        handles, labels = _legend_entries(axes.ravel(), [s.label for s in everything])
        fig.legend(handles, labels, loc="outside lower center", ncols=len(labels), title=legend_title, frameon=False)
    title = "Training dynamics: end-to-end (GRPO) vs frozen head (+Fix), with and without MTE"
    fig.suptitle(title + (f" ({blocks[0][0]})" if len(blocks) == 1 and blocks[0][0] else ""))
    return fig


def _head_grads(root: str | Path, runs: Sequence[str]) -> bool:
    """Whether the runs' logged gradient statistics are the head's: their config (summary.json, what the trainer
    ran with) freezes the AR. Runs from before freeze_ar existed trained it."""
    frozen = {bool((load_summary(root, r).get("config") or {}).get("freeze_ar", False)) for r in runs}
    if len(frozen) > 1:
        raise ValueError(
            f"report dynamics: runs {list(runs)} of one variant disagree on freeze_ar; rerun the stale ones"
        )
    return frozen.pop()


def dynamics(root: str | Path, spec: dict, confidence: float = 0.95) -> Figure:
    """Fig. 2a/2b, Fig. 5 from ``<root>/<run>/metrics.csv`` and ``summary.json`` (freeze_ar: whose gradient the
    run logged); ``spec = {"runs": [train/... runs]}``. Each variant its own colour (``variant_colors``)."""
    runs = _require_runs(spec, "dynamics")
    combos = list(dict.fromkeys((r.policy, r.reward) for r in runs))
    variants = list(dict.fromkeys(r.variant for r in runs))
    colors = variant_colors(variants)
    blocks = []
    for policy, reward in combos:
        series = []
        for v in variants:
            picked = [r.run for r in runs if (r.policy, r.reward, r.variant) == (policy, reward, v)]
            if picked:
                series.append(
                    Series(
                        _label(v, root, picked),
                        colors[v],
                        [load_metrics(root, r) for r in picked],
                        _head_grads(root, picked),
                    )
                )
        blocks.append((f"{policy}, {reward} reward", series))
    return plot_dynamics(blocks, confidence)


# --------------------------------------------------------------------------------------------
# Fig. 4: uncertainty maps
# --------------------------------------------------------------------------------------------


def plot_uncertainty(maps: dict, max_trajectories: int = 4) -> Figure:
    """One row per prompt: the sample, its per-token uncertainty on the image grid, MTE trajectories."""
    images, unc, prompts, traj = maps["images"], maps["uncertainty"], maps["prompts"], maps.get("trajectories")
    n_traj = 0 if traj is None else min(traj.shape[1], max_trajectories)
    ncols = 2 + n_traj
    fig = Figure(figsize=(2.3 * ncols + 0.6, 2.5 * len(prompts) + 0.4), layout="constrained")
    subfigs = np.atleast_1d(fig.subfigures(len(prompts), 1))
    for p, sub in enumerate(subfigs):
        axes = sub.subplots(1, ncols)
        h, w = images[p].shape[:2]
        axes[0].imshow(images[p], interpolation="nearest")
        axes[0].set_title("sample", fontsize=9)
        # the token grid stretched over the image's pixel extent (nearest: one flat block per token)
        im = axes[1].imshow(unc[p], extent=(0, w, h, 0), interpolation="nearest", cmap="magma")
        axes[1].set_title("token uncertainty", fontsize=9)
        cbar = sub.colorbar(im, ax=axes[1], fraction=0.046, pad=0.03)
        cbar.set_label("std over S draws at its commit step", fontsize=8)
        cbar.ax.tick_params(labelsize=7)
        for s in range(n_traj):
            axes[2 + s].imshow(traj[p, s], interpolation="nearest")
            axes[2 + s].set_title(f"trajectory {s + 1}" + (" (committed)" if s == 0 else ""), fontsize=9)
        for ax in axes:
            ax.set_xticks([])
            ax.set_yticks([])
        sub.suptitle(_wrap(prompts[p], 18 * ncols), fontsize=10)
    fig.suptitle(
        "Per-token uncertainty of the base policy (MTE, design.md §3.9): each token's std over the S final latents\n"
        "drawn from the same z_k at the AR step k that commits it (the committed sample among them), "
        "mean over channels",
        fontsize=11,
    )
    return fig


def uncertainty(root: str | Path, spec: dict, confidence: float = 0.95) -> Figure:
    """Fig. 4 from ``maps.npz``; ``spec = {"maps": path}`` (default ``<root>/uncertainty/maps.npz``)."""
    return plot_uncertainty(load_uncertainty(spec.get("maps") or Path(root) / "uncertainty" / "maps.npz"))


# --------------------------------------------------------------------------------------------
# Fig. 6 / Fig. 7a: sample grids
# --------------------------------------------------------------------------------------------


def plot_sample_grid(
    cells: Sequence[Sequence[np.ndarray]],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str,
    row_label_width: int = 26,
) -> Figure:
    """``cells[r][c]`` uint8 [H, W, 3]; tiny images are shown pixel-exact (nearest)."""
    nrows, ncols = len(cells), len(col_labels)
    fig = Figure(figsize=(1.5 * ncols + 2.2, 1.5 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for r in range(nrows):
        for c in range(ncols):
            ax = axes[r, c]
            ax.imshow(cells[r][c], interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(col_labels[c], fontsize=10)
        axes[r, 0].set_ylabel(_wrap(row_labels[r], row_label_width), rotation=0, ha="right", va="center", fontsize=8)
    fig.suptitle(title, fontsize=12)
    return fig


def _common_prompts(root: str | Path, runs: Sequence[str], n: int) -> tuple[list[str], dict[str, dict]]:
    listed = {r: list_samples(root, r) for r in runs}
    common = sorted(set.intersection(*(set(s) for s in listed.values())))
    if not common:
        raise ValueError(f"the sample folders of {list(runs)} share no prompt; were they sampled from the same suite?")
    return common[:n], listed


def samples(root: str | Path, spec: dict, confidence: float = 0.95) -> Figure:
    """Fig. 6: rows = prompts, columns = Base, GRPO*, +Fix*, +MTE, +Sim (lowest seed, image index 0).

    ``spec = {"base": [base/<policy>], "runs": [train/... runs], "prompts": N}``.
    """
    runs = _require_runs(spec, "samples")
    combos = list(dict.fromkeys((r.policy, r.reward) for r in runs))
    variants = list(dict.fromkeys(r.variant for r in runs))
    columns: list[tuple[str, str]] = []  # (label, run)
    for policy, reward in combos:
        suffix = f"\n{policy} / {reward}" if len(combos) > 1 else ""
        columns.append(("Base" + suffix, f"base/{policy}"))
        for v in variants:
            picked = sorted(
                (r for r in runs if (r.policy, r.reward, r.variant) == (policy, reward, v)), key=lambda r: r.seed
            )
            if picked:
                columns.append((_label(v, root, [picked[0].run]) + suffix, picked[0].run))
    prompts, listed = _common_prompts(root, [run for _, run in columns], int(spec.get("prompts", 6)))
    cells = [[sample_image(listed[run][p]) for _, run in columns] for p in prompts]
    seed = min(r.seed for r in runs)
    return plot_sample_grid(
        cells, prompts, [c for c, _ in columns], f"Samples on evaluation prompts (seed {seed}, first image per prompt)"
    )


def _point_label(params: dict[str, float], sep: str = ", ") -> str:
    return sep.join(f"{ABLATION_SYMBOLS.get(k, k)}={_fmt(v)}" for k, v in params.items())


def ablation_samples(root: str | Path, spec: dict, confidence: float = 0.95) -> Figure:
    """Fig. 7a: rows = ablation points (k, tau, S; lowest seed), columns = the first N common prompts."""
    runs = _require_runs(spec, "ablation-samples", kind="ablation")
    by_point: dict[tuple, RunId] = {}
    for r in sorted(runs, key=lambda r: r.seed):
        by_point.setdefault(tuple(r.params.items()), r)
    chosen = [by_point[p] for p in sorted(by_point, key=lambda p: tuple(v for _, v in p))]  # by k, then tau, S
    prompts, listed = _common_prompts(root, [r.run for r in chosen], int(spec.get("prompts", 6)))
    cells = [[sample_image(listed[r.run][p]) for p in prompts] for r in chosen]
    return plot_sample_grid(
        cells,
        [_point_label(r.params, "\n") for r in chosen],
        [_wrap(p, 20) for p in prompts],
        "Ablation samples per masking ratio k, threshold τ and trajectories S",
        row_label_width=12,
    )


# --------------------------------------------------------------------------------------------
# Fig. 7b / 7c: ablation curves and final metrics
# --------------------------------------------------------------------------------------------


def _mode(values) -> float:
    """Most common value; ties go to the smallest."""
    counts = Counter(values)
    top = max(counts.values())
    return min(v for v, c in counts.items() if c == top)


def _held_values(runs: Sequence[RunId]) -> dict[str, float]:
    """Each parameter's most common value over the distinct ablation points (seeds counted once)."""
    points = {tuple(sorted(r.params.items())) for r in runs}
    keys = list(runs[0].params)
    return {k: _mode([dict(p)[k] for p in points]) for k in keys}


def _others_held(run: RunId, free: str, held: dict[str, float]) -> bool:
    return all(math.isclose(run.params[k], v) for k, v in held.items() if k != free)


def ablation_curves(root: str | Path, spec: dict, confidence: float = 0.95, window: int | None = None) -> Figure:
    """Fig. 7b: training reward (rolling mean) vs step, one line per k, S and tau at their most common values."""
    runs = _require_runs(spec, "ablation-curves", kind="ablation")
    held = _held_values(runs)
    free = "top_frac"
    picked = [r for r in runs if _others_held(r, free, held)]
    frames = {r.run: load_metrics(root, r.run) for r in picked}
    if window is None:  # the per-batch reward is noisy: about 8 points per curve, at most 25 steps averaged
        longest = max(len(f) for f in frames.values())
        window = max(1, min(25, round(longest / 8)))
    ks = sorted({r.params[free] for r in picked})
    cmap = matplotlib.colormaps["viridis"]
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.subplots()
    for i, k in enumerate(ks):
        seeds = []
        for r in picked:
            if math.isclose(r.params[free], k):
                f = frames[r.run][["step", "reward_mean"]].dropna()
                seeds.append(f.assign(reward_mean=f["reward_mean"].rolling(window, min_periods=1).mean()))
        agg = aggregate_seeds(seeds, "reward_mean", confidence)
        _band(ax, agg, "step", cmap(i / max(1, len(ks) - 1) * 0.9), f"k = {_fmt(k)} (n={len(seeds)})")
    held_txt = _point_label({k: v for k, v in held.items() if k != free})
    smoothing = f"rolling mean over {window} steps" if window > 1 else "not smoothed"
    ax.set_title(f"Training reward per masking ratio k ({held_txt}; {smoothing})")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step (optimizer updates)")
    ax.set_ylabel("mean training reward (rollout batch)")
    ax.grid(alpha=0.3)
    ax.legend(title="k: fraction of tokens in the MTE mask", fontsize=8, loc="best")
    return fig


_AXIS_LABELS = {
    "top_frac": "k: fraction of most uncertain tokens (MTE)",
    "tau": "τ: consistency threshold (Sim)",
    "trajectories": "S: trajectories per token (log scale)",
}
_METRIC_COLORS = ["#0072B2", "#D55E00", "#E69F00", "#CC79A7", "#009E73"]


def _metric_panel(ax, xs: list[float], stats: list[tuple[float, float, int]], base: float | None, color: str) -> None:
    """Mean over seeds per point, its t-interval as an error bar where it has one (a lone seed: the point
    alone), each point's seed count, and the base's score as a dotted line that the y range keeps inside."""
    mean = np.array([m for m, _, _ in stats])
    half = np.array([h for _, h, _ in stats])
    ax.plot(xs, mean, color=color, marker="o", lw=1.4)
    ok = np.isfinite(half)
    if ok.any():
        ax.errorbar(np.asarray(xs)[ok], mean[ok], yerr=half[ok], fmt="none", ecolor=color, capsize=3, lw=1.2)
    for x, m, (_, _, n) in zip(xs, mean, stats):
        ax.annotate(f"n={n}", (x, m), textcoords="offset points", xytext=(4, 4), fontsize=7, color=color)
    if base is not None:  # a spread of a few thousandths between points reads as what it is next to the base
        ax.axhline(base, color=color, linestyle=":", linewidth=1.2)
        err = np.nan_to_num(half, nan=0.0)
        lo, hi = np.nanmin(np.r_[mean - err, base]), np.nanmax(np.r_[mean + err, base])
        pad = 0.08 * max(hi - lo, 1e-3)
        ax.set_ylim(min(lo - pad, ax.get_ylim()[0]), max(hi + pad, ax.get_ylim()[1]))


def ablation_final(root: str | Path, spec: dict, confidence: float = 0.95) -> Figure:
    """Fig. 7c: CompBench overall strict and each preference score vs k, tau, S: one row per parameter the
    grid varies (the other two held at their most common values), one panel per metric (each on its own
    y scale; no second y axis to read against the wrong line).

    Error bars are the t-interval over seeds where a point has several, and each point says its seed count.
    `spec["base"]` (a base run): its scores as dotted reference lines inside every axis.
    """
    runs = _require_runs(spec, "ablation-final", kind="ablation")
    held = _held_values(runs)
    scores = {r.run: eval_scores(root, r.run) for r in runs}
    base = eval_scores(root, spec["base"]) if spec.get("base") else {}
    scorers = list(dict.fromkeys(m for s in scores.values() for g, m in s if g == "pref"))
    metrics = [(("compbench", "overall"), "CompBench overall (strict)", "strict accuracy")]
    metrics += [(("pref", s), f"{s} (preference)", "mean preference score") for s in scorers]
    # one row per parameter the grid varies (with the others held): a one-point panel shows nothing
    varied = [
        f
        for f in ("top_frac", "tau", "trajectories")
        if len({r.params[f] for r in runs if f in r.params and _others_held(r, f, held)}) > 1
    ]
    if not varied:
        raise ValueError("report ablation-final: the grid varies none of top_frac, tau, trajectories")
    fig = Figure(figsize=(4.2 * len(metrics), 3.6 * len(varied) + 0.5), layout="constrained")
    rows = np.atleast_1d(fig.subfigures(len(varied), 1))
    for sub, free in zip(rows, varied):
        picked = [r for r in runs if free in r.params and _others_held(r, free, held)]
        xs = sorted({r.params[free] for r in picked})
        axes = np.atleast_1d(sub.subplots(1, len(metrics)))
        for ax, (key, title, ylabel), color in zip(axes, metrics, _METRIC_COLORS * len(metrics)):
            stats = [
                mean_ci(
                    [scores[r.run].get(key, math.nan) for r in picked if math.isclose(r.params[free], x)], confidence
                )
                for x in xs
            ]
            _metric_panel(ax, xs, stats, base.get(key), color)
            if free == "trajectories":
                ax.set_xscale("log", base=2)
                ax.set_xticks(xs, [_fmt(x) for x in xs])
            ax.set_xlabel(_AXIS_LABELS.get(free, free))
            ax.set_ylabel(ylabel)
            ax.set_title(title, color=color)
            ax.grid(alpha=0.3)
        held_txt = _point_label({k: v for k, v in held.items() if k != free})
        sub.suptitle(f"vs {ABLATION_SYMBOLS.get(free, free)} ({held_txt})", fontsize=11)
    seeds = max(Counter(tuple(sorted(r.params.items())) for r in runs).values())
    note = (
        f"mean over seeds, error bars: {confidence:.0%} t-interval where a point has ≥2 seeds"
        if seeds > 1
        else "one seed per point"
    )
    fig.suptitle(
        f"Final evaluation vs ablation parameter ({note}; n: seeds per point"
        + ("; dotted: base policy)" if base else ")")
    )
    return fig


# --------------------------------------------------------------------------------------------


def _require_runs(spec: dict, what: str, kind: str = "train") -> list[RunId]:
    runs = [parse_run(r) for r in spec.get("runs") or []]
    if not runs:
        raise ValueError(f"report {what}: the runs JSON lists no runs")
    wrong = [r.run for r in runs if r.kind != kind]
    if wrong:
        raise ValueError(f"report {what}: expected {kind}/... runs, got {wrong}")
    return runs
