"""The claims report written out: ``<prefix>.csv`` (one row per claim), ``<prefix>_paired.csv`` (every
paired difference) and ``<prefix>.md``, the tables a reader checks a claim in (effect, interval, verdict,
power, and the second seed set's decision beside the first's). Computing the claims is `claims`.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from margrpo.infra.files import atomic_write_csv, atomic_write_text
from margrpo.reporting.claims import POWER_TARGET, Claims


def _fmt(x: float, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:+.{digits}f}"


def _abs(x: float) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.3f}"


def to_markdown(c: Claims) -> str:
    out = [
        "**Claims.** Each row: a claim of the paper (a-d, f, h-j) or beyond it (e), the paired difference that tests "
        "it (mean over seeds), the 95% interval that decides it and the verdict. " + " ".join(c.notes),
        "",
        "Power: `half` is the 95% interval's half-width (t over seeds), `MDE80` the smallest effect this many seeds "
        "detect with 80% power, `seeds to settle` the seeds at which MDE80 falls to the measured effect.",
        "",
        "| block | claim | statement | comparison | metric | seeds | effect | 95% CI | CI | verdict | half | MDE80 "
        "| seeds to settle |"
        + (" second set: seeds | effect | 95% CI | verdict | MDE80 | **both** |" if "both" in c.claims else ""),
        "|:---|:---|:---|:---|:---|---:|---:|:---|:---|:---|---:|---:|---:|"
        + ("---:|---:|:---|:---|---:|:---|" if "both" in c.claims else ""),
    ]
    out += [_claim_line(r) for r in c.claims.to_dict("records")]
    if len(c.power):
        out += [
            "",
            "**Power.** 95% CI half-width of variant - GRPO* on the validation reward at the held-out best step "
            "(`val@best-heldout`: each half of the validation prompts scored at the best step the other half chose; "
            f"target <= {POWER_TARGET}) and the smallest effect detected with 80% power:",
            "",
            "| block | method | seeds | difference | half-width (t) | half-width (bootstrap) | MDE80 | target met |",
            "|:---|:---|---:|---:|---:|---:|---:|:---|",
        ]
        for r in c.power.to_dict("records"):
            out.append(
                f"| {r['block']} | {r['method']} - {r['reference']} | {r['n_seeds']} | {_fmt(r['diff'])} | "
                f"{r['t_half']:.3f} | {r['boot_half']:.3f} | {_abs(r['mde80'])} | {'yes' if r['met'] else 'no'} |"
            )
    if len(c.paired):
        out += [
            "",
            "**Every paired difference** (t: over seeds; bootstrap: prompts x seeds):",
            "",
            "| block | metric | method - reference | seeds | difference | t 95% CI | bootstrap 95% CI |",
            "|:---|:---|:---|---:|---:|:---|:---|",
        ]
        for r in c.paired.to_dict("records"):
            t = f"[{_fmt(r['t_lo'])}, {_fmt(r['t_hi'])}]" if math.isfinite(r["t_lo"]) else "–"
            out.append(
                f"| {r['block']} | {r['metric']} | {r['method']} - {r['reference']} | {r['n_seeds']} | "
                f"{_fmt(r['diff'])} | {t} | [{_fmt(r['boot_lo'])}, {_fmt(r['boot_hi'])}] |"
            )
    return "\n".join(out) + "\n"


def _claim_line(r: dict) -> str:
    """A claim's row of the claims table (a ratio, claim b's and h-j's noise: effect as a factor, no half-width or
    MDE80)."""
    ratio = "ratio" in r["metric"]
    eff = f"{r['diff']:.3f}x" if ratio and math.isfinite(r["diff"]) else _fmt(r["diff"])
    ci = (
        (f"[{r['lo']:.3f}, {r['hi']:.3f}]" if ratio else f"[{_fmt(r['lo'])}, {_fmt(r['hi'])}]")
        if math.isfinite(r["lo"])
        else "–"
    )
    half = (r["t_hi"] - r["t_lo"]) / 2 if not ratio and math.isfinite(r["t_lo"]) else math.nan
    mde, need = r.get("mde80", math.nan), r.get("seeds_needed", math.nan)
    settle = (
        "–"
        if ratio or not isinstance(need, (int, float)) or not math.isfinite(need) or r["verdict"] != "not settled"
        else f"{need:g}"
    )
    return (
        f"| {r['block']} | {r['claim']} | {r['statement']} | {r['comparison']} | {r['metric']} | "
        f"{r['n_seeds']} | {eff} | {ci} | {r['ci']} | **{r['verdict']}** | {_abs(half)} | "
        f"{_abs(np.nan if ratio else mde)} | {settle} |" + (_replicate_cells(r, ratio) if "both" in r else "")
    )


def _replicate_cells(r: dict, ratio: bool) -> str:
    """A claim's second-seed-set cells: seeds, effect, interval, verdict, MDE80, and the verdict of both sets."""
    if not isinstance(r["replicate_verdict"], str):
        return " – | – | – | – | – | – |"
    eff = f"{r['replicate_diff']:.3f}x" if ratio else _fmt(r["replicate_diff"])
    lo, hi = r["replicate_lo"], r["replicate_hi"]
    ci = "–" if not math.isfinite(lo) else f"[{lo:.3f}, {hi:.3f}]" if ratio else f"[{_fmt(lo)}, {_fmt(hi)}]"
    return (
        f" {int(r['replicate_n_seeds'])} | {eff} | {ci} | {r['replicate_verdict']} | "
        f"{_abs(np.nan if ratio else r['replicate_mde80'])} | **{r['both']}** |"
    )


def write_claims(c: Claims, prefix: str | os.PathLike) -> list[Path]:
    """``<prefix>.csv`` (the claims), ``<prefix>_paired.csv`` (every difference), ``<prefix>.md`` (both, readable)."""
    prefix = os.fspath(prefix)
    return [
        atomic_write_csv(c.claims, f"{prefix}.csv"),
        atomic_write_csv(c.paired, f"{prefix}_paired.csv"),
        atomic_write_text(f"{prefix}.md", to_markdown(c)),
    ]
