"""Table 3 and the wall-clock figure (issue #19): MAR-GRPO beside related methods in the toy lab.

Each method is a set of runs (seeds) of one policy, measured against that policy's own base:
MAR-GRPO on toy-nova, plain GRPO and MARVAL-RL on the one-step distilled MAR (toy-marval), plain
GRPO and MaskGRPO on the discrete masked-token policy (toy-mask). Gains over different bases are
not on one scale, so rows are compared (bold) only within a base.

    spec = {"methods": [{"label": "MARVAL-RL", "base": "base/toy-marval",
                         "runs": ["train/toy-marval/mixed/marval-rl/seed0", ...]}, ...]}
    table3(root, spec, confidence)             -> tables.Table (write with tables.write_table)
    related_wallclock(root, spec, confidence)  -> matplotlib Figure

Per method, Table 3 reports (columns ``<group>/<metric>/{mean,ci,n}`` as Tables 1-2):

- ``base/val reward``: the base policy's validation reward (mean over the runs' ``base_val_scores``);
- ``base/CompBench``: the base policy's CompBench-style overall strict score (``eval/base/<policy>``);
- ``gain/val gain``: validation reward at the reported checkpoint (``selection.json``) minus the
  base's on the same prompts and noise, paired per prompt within each seed (``paired.difference``,
  metric ``val@selected``); mean over seeds, t-interval over seeds, bootstrap interval over
  prompts x seeds in the ``boot_lo`` / ``boot_hi`` columns;
- ``gain/CompBench gain``: the same for CompBench-style strict accuracy, paired per evaluation
  image (``compbench_per_image.csv``, same prompt and index);
- ``time/s per step``: per seed the median of ``step_time_s`` over RL steps (validation excluded),
  then mean and t-interval over seeds; ``min`` / ``max`` over seeds beside it. Lower is better.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from margrpo.reporting.figures import _EXTRA_COLORS, VARIANT_COLORS, _band
from margrpo.reporting.paired import MIN_SEEDS_FOR_T, RunScores, difference, load_run
from margrpo.reporting.results import (
    MissingResultError,
    aggregate_seeds,
    load_compbench,
    load_compbench_per_image,
    load_metrics,
    load_selection,
    mean_ci,
    parse_run,
)
from margrpo.reporting.tables import Table, _run_gains

__all__ = [
    "Method",
    "methods_from_spec",
    "step_times",
    "wallclock_curve",
    "table3",
    "related_wallclock",
    "TABLE3_METRICS",
]

TABLE3_METRICS = [
    ("base", "val reward"),
    ("base", "CompBench"),
    ("gain", "val gain"),
    ("gain", "CompBench gain"),
    ("time", "s per step"),
]
# base columns describe the reference, not the method: never bold; the fastest step is the best
TABLE3_RANKING = {("base", "val reward"): 0, ("base", "CompBench"): 0, ("time", "s per step"): -1}
# the colours it had before the ladder named head and committed (theirs), then the spare ones
METHOD_COLORS = [VARIANT_COLORS[v] for v in ("sim", "grpo", "fix", "mte", "head", "committed")] + _EXTRA_COLORS
BASE_MARKERS = ["o", "s", "^", "D", "v"]


@dataclass(frozen=True)
class Method:
    """One row of Table 3 / one line of the figure: a label, its base policy run id and its runs (seeds)."""

    label: str
    base: str  # base/<policy>
    runs: tuple[str, ...]


def methods_from_spec(spec: dict) -> list[Method]:
    """Validate ``spec["methods"]``: each needs a label, a ``base/<policy>`` and train runs of that same policy."""
    entries = spec.get("methods")
    if not entries:
        raise ValueError('related methods: the runs JSON needs "methods": [{"label", "base", "runs"}, ...]')
    out = []
    for entry in entries:
        missing = [k for k in ("label", "base", "runs") if not entry.get(k)]
        if missing:
            raise ValueError(f"related methods: entry {entry!r} lacks {missing}")
        base = parse_run(entry["base"])
        if base.kind != "base":
            raise ValueError(f"method {entry['label']!r}: base {entry['base']!r} is not a base/<policy> run id")
        for run in entry["runs"]:
            r = parse_run(run)
            if r.kind != "train" or r.policy != base.policy:
                raise ValueError(
                    f"method {entry['label']!r}: run {run!r} is not a train/{base.policy}/... run; "
                    f"its gain is measured against {entry['base']}"
                )
        out.append(Method(str(entry["label"]), base.run, tuple(entry["runs"])))
    labels = [m.label for m in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"related methods: labels must be unique, got {labels}")
    return out


def step_times(root: str | Path, run: str) -> pd.Series:
    """Seconds of each RL step (``step_time_s`` of metrics.csv; validation excluded), indexed by step."""
    metrics = load_metrics(root, run)
    if "step_time_s" not in metrics.columns or metrics["step_time_s"].notna().sum() == 0:
        raise ValueError(f"{Path(root) / run / 'metrics.csv'} has no step_time_s values (written by `margrpo train`)")
    return metrics.set_index("step")["step_time_s"]


# --------------------------------------------------------------------------------------------
# Table 3
# --------------------------------------------------------------------------------------------


def _scores(root: Path, method: Method) -> dict[int, RunScores]:
    """Each seed's paired measurements; the reported checkpoint and its per-image scores are required."""
    out = {}
    for run in method.runs:
        load_selection(root, run)  # raises, naming select/<run>/selection.json, when absent
        scores = load_run(root, run)
        if scores.compbench is None:  # load_run skips an absent file; here it is needed, so name it
            scores.compbench = load_compbench_per_image(root, run)
        out[scores.seed] = scores
    return out


def _cells(d: dict) -> dict[str, float]:
    """A paired difference as mean / t half-width / seeds, with the bootstrap interval beside them."""
    return {"mean": d["diff"], "ci": d["t_half"], "n": d["n_seeds"], "boot_lo": d["boot_lo"], "boot_hi": d["boot_hi"]}


def _method_record(root: Path, method: Method, confidence: float) -> dict:
    """One row of Table 3 (see the module docstring for each column)."""
    scores = _scores(root, method)
    base_cb = load_compbench_per_image(root, method.base)
    base_overall = load_compbench(root, method.base)["strict"].iloc[-1]
    val = difference(scores, None, "val@selected", confidence)
    comp = difference(scores, None, "compbench", confidence, base_cb)
    if comp["n_seeds"] == 0:
        raise ValueError(
            f"method {method.label!r}: no evaluation image of its runs matches one of "
            f"{root / 'eval' / method.base / 'compbench_per_image.csv'} (same prompt and index)"
        )
    medians = [float(step_times(root, run).median()) for run in method.runs]
    cells = {
        ("base", "val reward"): dict(
            zip(("mean", "ci", "n"), mean_ci([s.base_val.mean() for s in scores.values()], confidence))
        ),
        ("base", "CompBench"): {"mean": float(base_overall), "ci": math.nan, "n": 1},
        ("gain", "val gain"): _cells(val),
        ("gain", "CompBench gain"): _cells(comp),
        ("time", "s per step"): {
            **dict(zip(("mean", "ci", "n"), mean_ci(medians, confidence))),
            "min": min(medians),
            "max": max(medians),
        },
    }
    rec = {
        "block": parse_run(method.base).policy,
        "method": method.label,
        "base": method.base,
        "runs": ";".join(method.runs),
        "n_runs": len(method.runs),
        "seeds": len(scores),
        "steps": ";".join(str(load_selection(root, r)["step"]) for r in method.runs),
    }
    for (group, metric), stats in cells.items():
        rec.update({f"{group}/{metric}/{k}": v for k, v in stats.items()})
    return rec


def table3(root: str | Path, spec: dict, confidence: float = 0.95, digits: int = 3) -> Table:
    """Table 3 (issue #19): each method's gain over its own base on the validation reward and the
    CompBench-style evaluation, and its wall-clock per RL step. ``spec = {"methods": [...]}``."""
    root = Path(root)
    methods = methods_from_spec(spec)
    data = pd.DataFrame.from_records([_method_record(root, m, confidence) for m in methods])
    few = [m.label for m, n in zip(methods, data["seeds"]) if n < MIN_SEEDS_FOR_T]
    by_base = {b: [m.label for m in methods if m.base == b] for b in dict.fromkeys(m.base for m in methods)}
    caption = (
        "Related methods in the toy lab, each against its own base policy ("
        + "; ".join(f"{', '.join(labels)}: {b}" for b, labels in by_base.items())
        + "). "
        "Gains: reported checkpoint minus base, paired per validation prompt (val gain) or per evaluation "
        "image (CompBench gain, strict accuracy) within each seed; "
        f"mean over seeds ± half-width of the {confidence:.0%} t-interval over seeds "
        "(the CSV adds a bootstrap interval over prompts x seeds). "
        "s per step: median seconds of an RL step (validation excluded) per seed, mean ± t-interval over seeds. "
        "Bold: best gain and fastest step among methods sharing a base."
    )
    if few:
        caption += f" Fewer than {MIN_SEEDS_FOR_T} seeds (interval unreliable or absent): {', '.join(few)}."
    return Table(
        "table3", "Table 3", caption, data, list(TABLE3_METRICS), ["method", "seeds"], digits, dict(TABLE3_RANKING)
    )


# --------------------------------------------------------------------------------------------
# Figure: validation gain against wall-clock
# --------------------------------------------------------------------------------------------


def wallclock_curve(root: str | Path, run: str) -> pd.DataFrame:
    """``step, cum_s, gain`` at each validated step: seconds of RL so far (the sum of ``step_time_s``
    up to that step) and the validation reward minus the base's (``tables._run_gains``)."""
    times = step_times(root, run).fillna(0.0).cumsum()
    _, gains = _run_gains(root, run)
    steps = [s for s in sorted(gains) if s in times.index]
    return pd.DataFrame({"step": steps, "cum_s": [float(times[s]) for s in steps], "gain": [gains[s] for s in steps]})


def related_wallclock(root: str | Path, spec: dict, confidence: float = 0.95) -> Figure:
    """Validation gain over each method's own base against seconds of RL (log axis: the methods' steps
    differ by an order of magnitude in cost); mean over seeds at each validated step, t-interval band."""
    methods = methods_from_spec(spec)
    bases = list(dict.fromkeys(m.base for m in methods))
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    n_max = 0
    for i, m in enumerate(methods):
        curves = [wallclock_curve(root, r) for r in m.runs]
        agg = aggregate_seeds(curves, "gain", confidence)
        seconds = aggregate_seeds(curves, "cum_s", confidence).set_index("step")["mean"]
        agg = agg.assign(cum_s=seconds.reindex(agg["step"]).to_numpy())
        agg = agg[agg["cum_s"] > 0]  # a log axis has no 0
        if not len(agg):
            raise MissingResultError(f"method {m.label!r}: its runs logged no validation reward after an RL step")
        n_max = max(n_max, len(curves))
        _band(
            ax,
            agg,
            "cum_s",
            METHOD_COLORS[i % len(METHOD_COLORS)],
            f"{m.label} (n={len(curves)})",
            marker=BASE_MARKERS[bases.index(m.base) % len(BASE_MARKERS)],
        )
    ax.axhline(0.0, color=VARIANT_COLORS["base"], ls="--", lw=1.2, label="base policy (each method's own)")
    ax.set_xscale("log")
    # plain seconds (30, 40, 1e+03) rather than 3 x 10^1; minor ticks labelled only over a short range, as by default
    ax.xaxis.set_major_formatter(LogFormatter(labelOnlyBase=True))
    ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    ax.set_xlabel("wall-clock seconds of RL (sum of step times; validation excluded; mean over seeds, log scale)")
    ax.set_ylabel("validation reward − base policy's (same prompts)")
    ax.grid(alpha=0.3, which="both")
    band = f"shaded: {confidence:.0%} t-interval over seeds" if n_max > 1 else "one seed per method"
    ax.legend(title=f"method (marker: base policy; {band})", fontsize=8, title_fontsize=8, loc="best")
    ax.set_title("Validation gain against wall-clock of RL, each method against its own base policy")
    return fig
