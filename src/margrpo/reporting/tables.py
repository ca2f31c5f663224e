"""Paper Tables 1 and 2 from evaluation files: CSV (numbers), Markdown and LaTeX (for reading).

A table is a list of rows, each row a label set and the runs (seeds) it averages. Each metric
cell is the mean over the row's runs and the half-width of the t-based confidence interval
(``results.mean_ci``). Metrics are the preference scorers' means (``preference.csv``) and every
CompBench category's strict score with ``overall`` last (``compbench.csv``), in file order.

    table = table2(root, {"base": [...], "runs": [...], "variants": [...]}, confidence=0.95)
    write_table(table, "results/toy/report/table2")   # -> table2.csv, table2.md, table2.tex

Rows are grouped into blocks (one per policy and reward setting); the best mean of each column
within a block is set in bold in the Markdown and LaTeX versions (all metrics: higher is better).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from margrpo.infra.files import atomic_write_csv, atomic_write_text
from margrpo.reporting.paired import heldout_best
from margrpo.reporting.results import (
    RunId,
    comparable_scores,
    load_metrics,
    load_selection,
    load_summary,
    mean_ci,
    parse_run,
)

__all__ = [
    "VARIANT_LABELS",
    "Table",
    "RowSpec",
    "build_table",
    "table1",
    "table2",
    "val_gain",
    "write_table",
    "to_markdown",
    "to_latex",
]

# Variant name -> the paper's row label (Table 2). Unknown variants keep their name.
VARIANT_LABELS = {
    "grpo": "GRPO",
    "fix": "+Fix",
    "mte": "+MTE",
    "sim": "+Sim",
    "committed": "+Fix (committed)",
    "head": "Head only",
    "control": "shuffled control",
}
METRIC_GROUPS = {
    "pref": "Preference (mean score)",
    "compbench": "T2I-CompBench (strict)",
    "val": "Validation reward",
    "gain": "Gain over the base policy",
    "base": "Base policy",
    "time": "Wall-clock",
    "lift": "Lift over the shuffled control",
}


@dataclass(frozen=True)
class RowSpec:
    """One table row: its labels and the runs (seeds) it averages."""

    policy: str
    reward: str | None
    method: str  # displayed label, e.g. "GRPO*"
    variant: str | None  # None for the base policy
    runs: tuple[str, ...]
    selection: str = ""  # selection rule(s) of the runs: "best", "fixed", "best/fixed"; "" for base
    steps: str = ""  # the reported checkpoint step of each run, ";"-separated


@dataclass
class Table:
    """Aggregated numbers plus what the renderers need to lay them out."""

    name: str  # "table1" -> LaTeX label tab:table1
    title: str  # "Table 1" (Markdown heading; LaTeX numbers its tables itself)
    caption: str
    data: pd.DataFrame  # one row per RowSpec: label columns, n_runs, "<group>/<metric>/{mean,ci,n}"
    metrics: list[tuple[str, str]]  # (group, metric) in column order
    label_columns: list[str]  # label columns shown in Markdown / LaTeX
    digits: int = 3
    # metric -> +1 (higher is better: the default), -1 (lower is better) or 0 (not ranked: never bold)
    ranking: dict[tuple[str, str], int] = field(default_factory=dict)

    def column(self, metric: tuple[str, str], stat: str) -> str:
        return f"{metric[0]}/{metric[1]}/{stat}"


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------


def _selection_label(root: str | Path, runs: Sequence[str], required: bool) -> tuple[str, str, str]:
    """(star, rule(s), selected steps) of a row's runs; star "*" iff every run reports its best checkpoint."""
    sels = [load_selection(root, r, required=required) for r in runs]
    if not sels or any(s is None for s in sels):
        return "", "", ""
    rules = sorted({str(s["rule"]) for s in sels})
    star = "*" if rules == ["best"] else ""
    return star, "/".join(rules), ";".join(str(s["step"]) for s in sels)


def build_table(
    root: str | Path, rows: Sequence[RowSpec], confidence: float, name: str, title: str, caption: str, digits: int = 3
) -> Table:
    """Read every run's evaluation files and aggregate each row over its runs."""
    if not rows:
        raise ValueError(f"{name}: no rows to build (no runs given)")
    checked = comparable_scores(
        root, [r for row in rows for r in row.runs]
    )  # one set of metrics, one suite, or an error
    scores: list[list[dict[tuple[str, str], float]]] = [[checked[r] for r in row.runs] for row in rows]
    metrics: list[tuple[str, str]] = []
    for group in ("pref", "compbench"):
        for row_scores in scores:
            for s in row_scores:
                metrics += [k for k in s if k[0] == group and k not in metrics]
    # keep `overall` the last CompBench column
    metrics.sort(key=lambda k: (k[0] != "pref", k == ("compbench", "overall")))

    records = []
    for row, row_scores in zip(rows, scores):
        rec = {
            "policy": row.policy,
            "reward": row.reward or "",
            "method": row.method,
            "variant": row.variant or "base",
            "selection": row.selection,
            "steps": row.steps,
            "runs": ";".join(row.runs),
            "n_runs": len(row.runs),
        }
        for m in metrics:
            mean, ci, n = mean_ci([s.get(m, math.nan) for s in row_scores], confidence)
            rec[f"{m[0]}/{m[1]}/mean"], rec[f"{m[0]}/{m[1]}/ci"], rec[f"{m[0]}/{m[1]}/n"] = mean, ci, n
        records.append(rec)
    data = pd.DataFrame.from_records(records)

    label_columns = []
    for col in ("policy", "reward"):  # a column only where it varies; a constant one goes in the caption
        values = list(dict.fromkeys(v for v in data[col] if v))
        if len(values) > 1:
            label_columns.append(col)
        if len(values) == 1:
            caption += f" {col.capitalize()}: {values[0]}."
    label_columns.append("method")
    return Table(name, title, caption, data, metrics, label_columns, digits)


def _policies_rewards(runs: Sequence[RunId]) -> tuple[list[str], list[str]]:
    policies = list(dict.fromkeys(r.policy for r in runs))
    rewards = list(dict.fromkeys(r.reward for r in runs))
    return policies, rewards


def _ci_note(confidence: float) -> str:
    return (
        f"Mean ± half-width of the {confidence:.0%} t-interval over seeds (no ± with one seed). "
        "Bold: best mean in the column within each policy / reward block."
    )


def table1(root: str | Path, spec: dict, confidence: float = 0.95, digits: int = 3) -> Table:
    """Paper Table 1: per policy, the base policy, +GRPO (``spec['baseline']``) and Ours (``spec['ours']``).

    ``spec = {"base": [base/<policy>, ...], "runs": [train/... runs], "baseline": str, "ours": str}``.
    """
    runs = [parse_run(r) for r in spec["runs"]]
    baseline, ours = spec["baseline"], spec["ours"]
    policies, rewards = _policies_rewards(runs)
    rows = []
    for policy in policies:
        for reward in rewards:
            rows.append(RowSpec(policy, None, "Base", None, (f"base/{policy}",)))
            for variant, label in (
                (baseline, "+GRPO" if baseline == "grpo" else VARIANT_LABELS.get(baseline, baseline)),
                (ours, "Ours"),
            ):
                picked = tuple(r.run for r in runs if (r.policy, r.reward, r.variant) == (policy, reward, variant))
                if picked:
                    star, rule, steps = _selection_label(root, picked, required=False)
                    rows.append(RowSpec(policy, reward, label + star, variant, picked, rule, steps))
    caption = (
        f"Base policies, +GRPO ({baseline}) and Ours ({ours}). "
        "Preference: mean score per scorer; T2I-CompBench: strict accuracy per category. "
        + _ci_note(confidence)
        + (" *: best checkpoint by validation reward." if any("*" in r.method for r in rows) else "")
        + "".join(warmup_note(policy, path) for policy, path in (spec.get("warmups") or {}).items())
    )
    return build_table(root, rows, confidence, "table1", "Table 1", caption, digits)


def warmup_note(policy: str, quality_path: str) -> str:
    """A sentence on a base that is its head warm-up: what the warm-up changed (its quality.json, before and after)."""
    from margrpo.infra.files import read_json

    after = read_json(quality_path)
    before = after.get("before_warmup")
    if not before:
        raise ValueError(f"{quality_path}: no before_warmup entry (not a `margrpo warmup` quality report)")

    def numbers(q: dict) -> str:
        failed = f"{q['no_valid_object']:.3f} of images with no valid object, " if "no_valid_object" in q else ""
        seen = q["single_object_color_and_shape"]["seen_pairs"]["accuracy"]
        return f"{failed}strict {q['overall']['strict']:.3f}, seen single objects {seen:.2f}"

    return (
        f" {policy}'s Base is its base after the head warm-up (quality suite: {numbers(before)} before it, "
        f"{numbers(after)} after)."
    )


def table2(root: str | Path, spec: dict, confidence: float = 0.95, digits: int = 3) -> Table:
    """Paper Table 2: Base, GRPO*, +Fix*, +MTE, +Sim per policy / reward setting.

    ``spec = {"base": [base/<policy>, ...], "runs": [train/... runs], "variants": [grpo, fix, ...]}``.
    A ``*`` marks variants whose runs all report their best checkpoint (selection rule ``best``).
    """
    runs = [parse_run(r) for r in spec["runs"]]
    variants = list(spec.get("variants") or dict.fromkeys(r.variant for r in runs))
    policies, rewards = _policies_rewards(runs)
    rows = []
    for policy in policies:
        for reward in rewards:
            if not any((r.policy, r.reward) == (policy, reward) for r in runs):
                continue  # two ladders: a policy of one and a reward of the other make no block
            rows.append(RowSpec(policy, None, "Base", None, (f"base/{policy}",)))
            for variant in variants:
                picked = tuple(r.run for r in runs if (r.policy, r.reward, r.variant) == (policy, reward, variant))
                if picked:
                    star, rule, steps = _selection_label(root, picked, required=True)
                    rows.append(
                        RowSpec(
                            policy, reward, VARIANT_LABELS.get(variant, variant) + star, variant, picked, rule, steps
                        )
                    )
    caption = (
        "The MAR-GRPO ladder. Preference: mean score per scorer; T2I-CompBench: strict accuracy "
        "per category. " + _ci_note(confidence) + " *: best checkpoint by validation reward; "
        "other variants report the step fixed in the config."
    )
    table = build_table(root, rows, confidence, "table2", "Table 2", caption, digits)
    control = spec.get("control")
    if control and any(row.variant == control for row in rows):
        _control_lifts(root, table, rows, control, confidence)
    return table


def _control_lifts(root: str | Path, table: Table, rows: Sequence[RowSpec], control: str, confidence: float) -> None:
    """Columns "lift over the control": in a block with a `control` row, each row's score minus the control's, per
    seed (the same seed's base, prompts and noise), mean and interval over seeds; on every preference score and
    CompBench overall. Rows of blocks without one get none (a dash)."""
    scores = comparable_scores(root, [r for row in rows for r in row.runs])
    metrics = [m for m in table.metrics if m[0] == "pref"] + [("compbench", "overall")]
    lifts = [("lift", f"{m[1]} - control") for m in metrics]
    seed_of = {r: parse_run(r).seed for row in rows if row.variant for r in row.runs}
    by_block = {(row.policy, row.reward): row for row in rows if row.variant == control}
    for m, lift in zip(metrics, lifts):
        means, cis, ns = [], [], []
        for row in rows:
            ref = by_block.get((row.policy, row.reward))
            diffs = []
            if ref is not None and row.variant not in (None, control):
                ctrl = {seed_of[r]: scores[r][m] for r in ref.runs}
                diffs = [scores[r][m] - ctrl[seed_of[r]] for r in row.runs if seed_of[r] in ctrl]
            mean, ci, n = mean_ci(diffs, confidence)
            means.append(mean), cis.append(ci), ns.append(n)
        table.data[table.column(lift, "mean")], table.data[table.column(lift, "ci")] = means, cis
        table.data[table.column(lift, "n")] = ns
    table.metrics += lifts
    table.caption += (
        f" Lift: each rung's score minus the {VARIANT_LABELS.get(control, control)}'s (a rung trained with its "
        "advantages shuffled: update noise, no credit) of the same seed, mean and interval over seeds; in blocks with "
        "such a control."
    )


def _run_gains(root: str | Path, run: str) -> tuple[float, dict[int, float]]:
    """(base validation reward, {step: validation reward - base}) of one run."""
    base = load_summary(root, run).get("base_val_reward")
    if base is None or not math.isfinite(float(base)):
        raise ValueError(
            f"{Path(root) / run / 'summary.json'} has no finite base_val_reward (written by `margrpo train`)"
        )
    val = load_metrics(root, run)[["step", "val_reward"]].dropna()
    return float(base), {int(step): float(v) - float(base) for step, v in zip(val["step"], val["val_reward"])}


def _heldout_gain(root: str | Path, run: str) -> float:
    """One run's held-out best gain (`paired.heldout_best`): on each half of the validation prompts, the gain of the
    best step chosen on the other half over the base; the two halves' gains averaged."""
    where = Path(root) / run / "summary.json"
    summary = load_summary(root, run)
    base = np.asarray(summary.get("base_val_scores") or [], dtype=np.float64)
    if not base.size:
        raise ValueError(f"{where} has no per-prompt base_val_scores (written by `margrpo train`); retrain the run")
    scores = heldout_best(summary["checkpoints"], str(where))
    if scores.shape != base.shape:
        raise ValueError(
            f"{where}: the base and the checkpoints were validated on different prompts "
            f"({base.size} vs {scores.size} scores)"
        )
    diff = scores - base
    return float((diff[0::2].mean() + diff[1::2].mean()) / 2)


def _gain_records(rows: list[tuple], metrics: list[tuple[str, str]], confidence: float) -> list[dict]:
    """val_gain's table rows: a row's labels and runs, then mean, CI half-width and n of each metric's values."""
    records = []
    for (policy, reward, method, variant, picked), values in rows:
        rec = {
            "policy": policy,
            "reward": reward,
            "method": method,
            "variant": variant,
            "runs": ";".join(picked),
            "n_runs": len(picked),
        }
        for m in metrics:
            rec[f"{m[0]}/{m[1]}/mean"], rec[f"{m[0]}/{m[1]}/ci"], rec[f"{m[0]}/{m[1]}/n"] = mean_ci(
                values.get(m, []), confidence
            )
        records.append(rec)
    return records


def _gain_caption(confidence: float, control: str | None) -> str:
    """val_gain's caption; with a control, what its lift column is."""
    return (
        "Validation reward of the base policy and each variant's gain over it (validation reward minus the "
        "base policy's on the same prompts and seeds), per validation step and at the best step. "
        "Best: the maximum over steps, biased upward (a run that learned nothing shows a positive one). "
        "Best, held out: the honest estimate — the best step chosen on half of the validation prompts "
        "(even or odd index), its gain measured on the other half, both ways and averaged. " + _ci_note(confidence)
    ) + (
        f" Lift: the last validated reward minus the {VARIANT_LABELS.get(control, control)}'s (its advantages "
        "shuffled: no credit) of the same seed, where the block has one."
        if control
        else ""
    )


def _last_step_lifts(picked: list[str], runs: Sequence[RunId], gains: dict, control: str) -> list[float]:
    """Each run's last validated reward minus that of the control of its block and seed (the same base and
    validation noise); none for the control's own runs."""
    first = parse_run(picked[0])
    if first.variant == control:
        return []
    ctrl = {r.seed: r.run for r in runs if (r.policy, r.reward, r.variant) == (first.policy, first.reward, control)}

    def last(run: str) -> float:
        return gains[run][1][max(gains[run][1])] if gains[run][1] else math.nan

    return [last(r) - last(ctrl[parse_run(r).seed]) for r in picked if parse_run(r).seed in ctrl]


def val_gain(root: str | Path, spec: dict, confidence: float = 0.95, digits: int = 3) -> Table:
    """Did RL lift the validation reward? Each variant's gain over the base policy at every validation step.

    ``spec = {"runs": [train/... runs], "variants": [grpo, fix, ...]}``. A run's gain at step s is
    its validation reward at s minus the base policy's on the same prompts and seeds (its
    ``summary.json``), so every seed is paired with its own baseline. ``best`` is the maximum
    over steps — what checkpoint selection sees, biased upwards by taking a maximum of noisy values:
    a run that learned nothing shows a positive best. ``best, held out`` is its honest reference: the
    step is chosen on one half of the validation prompts and its gain measured on the other, both ways
    (`paired.heldout_best`), so a run that learned nothing has an expected held-out best of 0.
    """
    runs = [parse_run(r) for r in spec["runs"]]
    if not runs:
        raise ValueError("val_gain: no runs given")
    variants = list(spec.get("variants") or dict.fromkeys(r.variant for r in runs))
    gains = {r.run: _run_gains(root, r.run) for r in runs}
    heldout = {r.run: _heldout_gain(root, r.run) for r in runs}
    steps = sorted({s for _, g in gains.values() for s in g})
    control = spec.get("control")
    controlled = control is not None and any(r.variant == control for r in runs)
    metrics = (
        [("val", "base")] + [("gain", f"step {s}") for s in steps] + [("gain", "best"), ("gain", "best, held out")]
    ) + [("lift", "last step - control")] * controlled
    policies, rewards = _policies_rewards(runs)

    def cells(picked: list[str]) -> dict[tuple[str, str], list[float]]:
        """A variant row's values per metric: one gain per run (seed); the base reward is on the Base row."""
        out = {("gain", f"step {s}"): [gains[r][1][s] for r in picked if s in gains[r][1]] for s in steps}
        out[("gain", "best")] = [max(gains[r][1].values()) for r in picked if gains[r][1]]
        out[("gain", "best, held out")] = [heldout[r] for r in picked]
        if controlled:
            out[("lift", "last step - control")] = _last_step_lifts(picked, runs, gains, control)
        return out

    rows = []  # (labels, values per metric)
    for policy in policies:
        for reward in rewards:
            block = [r.run for r in runs if (r.policy, r.reward) == (policy, reward)]
            if block:
                rows.append(((policy, reward, "Base", "base", block), {("val", "base"): [gains[r][0] for r in block]}))
            for variant in variants:
                picked = [r.run for r in runs if (r.policy, r.reward, r.variant) == (policy, reward, variant)]
                if picked:
                    rows.append(
                        ((policy, reward, VARIANT_LABELS.get(variant, variant), variant, picked), cells(picked))
                    )
    data = pd.DataFrame.from_records(_gain_records(rows, metrics, confidence))
    label_columns = [c for c in ("policy", "reward") if data[c].nunique() > 1] + ["method"]
    caption = _gain_caption(confidence, control if controlled else None)
    for col in ("policy", "reward"):
        if data[col].nunique() == 1:
            caption += f" {col.capitalize()}: {data[col].iloc[0]}."
    return Table("val_gain", "Validation gain", caption, data, metrics, label_columns, digits)


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def _headers(table: Table) -> list[str]:
    names = [m[1] for m in table.metrics]
    return [f"{g}:{m}" if names.count(m) > 1 else m for g, m in table.metrics]


def _blocks(table: Table) -> list[list[int]]:
    """Row indices grouped by consecutive (policy, reward-block) — a new block starts at each Base row,
    or, where the data has a ``block`` column, wherever its value changes."""
    blocks: list[list[int]] = []
    if "block" in table.data.columns:
        for i, block in enumerate(table.data["block"]):
            if not blocks or block != table.data.at[i - 1, "block"]:
                blocks.append([])
            blocks[-1].append(i)
        return blocks
    for i, variant in enumerate(table.data["variant"]):
        if variant == "base" or not blocks:
            blocks.append([])
        blocks[-1].append(i)
    return blocks


def _best(table: Table) -> set[tuple[int, tuple[str, str]]]:
    """(row, metric) cells holding the best mean of their column within their block (the maximum, or the
    minimum where ``table.ranking`` says lower is better); a lone value is not marked."""
    best = set()
    for block in _blocks(table):
        for m in table.metrics:
            direction = table.ranking.get(m, 1)
            means = table.data.loc[block, table.column(m, "mean")]
            if direction and means.notna().sum() > 1:
                top = means.max() if direction > 0 else means.min()
                best |= {(i, m) for i in block if means[i] == top}
    return best


def _cell(table: Table, i: int, m: tuple[str, str], bold: bool, latex: bool) -> str:
    mean, ci = table.data.at[i, table.column(m, "mean")], table.data.at[i, table.column(m, "ci")]
    if not math.isfinite(mean):
        return "–" if not latex else "--"
    d = table.digits
    text = f"{mean:.{d}f}"
    if latex:
        text = rf"\mathbf{{{text}}}" if bold else text
        return f"${text} \\pm {ci:.{d}f}$" if math.isfinite(ci) else f"${text}$"
    text = f"**{text}**" if bold else text
    return f"{text} ± {ci:.{d}f}" if math.isfinite(ci) else text


def to_markdown(table: Table) -> str:
    """A GitHub pipe table with the caption above it."""
    best = _best(table)
    header = table.label_columns + _headers(table)
    lines = [
        f"**{table.title}.** {table.caption}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join([":---"] * len(table.label_columns) + ["---:"] * len(table.metrics)) + "|",
    ]
    for i in range(len(table.data)):
        cells = [str(table.data.at[i, c]) or "–" for c in table.label_columns]
        if _one_seed_unlabelled(table, i):  # say why there is no ±
            cells[table.label_columns.index("method")] += " (1 seed)"
        cells += [_cell(table, i, m, (i, m) in best, latex=False) for m in table.metrics]
        lines.append("| " + " | ".join(c.replace("|", r"\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _one_seed_unlabelled(table: Table, i: int) -> bool:
    """A trained method's row averaged over one run, in a table with a method column and no seeds column
    (the base policy is one policy, not a seed)."""
    d = table.data
    if "method" not in table.label_columns or "seeds" in table.label_columns or "n_runs" not in d:
        return False
    return int(d.at[i, "n_runs"]) == 1 and ("variant" not in d or d.at[i, "variant"] != "base")


_LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "–": "--",
}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def to_latex(table: Table) -> str:
    """A booktabs ``table`` environment (needs ``\\usepackage{booktabs}``); metric groups as spanning headers."""
    best = _best(table)
    nl = len(table.label_columns)
    spans, start = [], nl + 1
    for group in dict.fromkeys(g for g, _ in table.metrics):
        width = sum(1 for g, _ in table.metrics if g == group)
        spans.append((group, start, start + width - 1))
        start += width
    out = [
        "% Generated by `margrpo report`; requires \\usepackage{booktabs}.",
        r"\begin{table}[t]",
        r"\centering",
        r"\small",
        rf"\caption{{{latex_escape(table.caption)}}}",
        rf"\label{{tab:{table.name}}}",
        r"\begin{tabular}{" + "l" * nl + "r" * len(table.metrics) + "}",
        r"\toprule",
        " & " * nl
        + " & ".join(
            rf"\multicolumn{{{b - a + 1}}}{{c}}{{{latex_escape(METRIC_GROUPS.get(g, g))}}}" for g, a, b in spans
        )
        + r" \\",
        "".join(rf"\cmidrule(lr){{{a}-{b}}}" for _, a, b in spans),
        " & ".join(
            latex_escape(h.capitalize() if h in table.label_columns else h)
            for h in table.label_columns + _headers(table)
        )
        + r" \\",
    ]
    for block in _blocks(table):
        out.append(r"\midrule")
        for i in block:
            cells = [latex_escape(table.data.at[i, c] or "–") for c in table.label_columns]
            cells += [_cell(table, i, m, (i, m) in best, latex=True) for m in table.metrics]
            out.append(" & ".join(cells) + r" \\")
    out += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(out) + "\n"


def write_table(table: Table, prefix: str | os.PathLike) -> list[Path]:
    """Write ``<prefix>.csv`` (all numbers), ``<prefix>.md`` and ``<prefix>.tex``, each atomically."""
    prefix = os.fspath(prefix)
    return [
        atomic_write_csv(table.data, f"{prefix}.csv"),
        atomic_write_text(f"{prefix}.md", to_markdown(table)),
        atomic_write_text(f"{prefix}.tex", to_latex(table)),
    ]
