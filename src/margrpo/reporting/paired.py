"""Paired comparisons of runs: each run's per-prompt scores, the paired difference of two methods over
the seeds both have, its two intervals, its verdict and the power of the design.

Within a seed every variant sees the same training prompts, generation orders and noise at each step,
and every validation and evaluation uses the same prompts and fixed noise (common random numbers),
so a variant's effect is measured as a *paired* difference against its reference run of the same
seed. Two intervals are reported for each difference:

- ``t``: the t-interval over seeds of the per-seed differences (the seed is the unit that repeats
  the whole experiment); used for the verdict when there are >= 3 seeds.
- ``bootstrap``: a paired bootstrap over seeds and, within each drawn seed, over prompts (or
  images): both methods keep the same draws. It also covers the measurement noise of the finite
  prompt set, and it is the only interval with one or two seeds, where it decides the verdict.

A verdict is ``reproduced`` when the interval lies entirely on the claimed side, ``refuted`` when it
lies entirely on the other side, and ``not settled`` otherwise. The claims report
(`margrpo.reporting.claims`), Table 3 (`related`) and the artifact measure (`artifacts`) share these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from margrpo.reporting.results import (
    load_compbench_per_image,
    load_metrics,
    load_selection,
    load_summary,
    mean_ci,
    parse_run,
)

MIN_SEEDS_FOR_T = 3
TIE = 1e-9  # differences this small are float round-off of identical runs, not effects


# --------------------------------------------------------------------------------------------
# Paired statistics
# --------------------------------------------------------------------------------------------


def paired_t(diffs: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float, int]:
    """(mean, lower, upper, n) of the t-interval of the mean of per-seed paired differences (`mean_ci`'s interval)."""
    mean, half, n = mean_ci(diffs, confidence)
    return mean, mean - half, mean + half, n


def paired_bootstrap(
    diffs: Sequence[np.ndarray], confidence: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of the mean paired difference, resampling seeds, then prompts within each
    drawn seed. ``diffs[s]`` holds seed s's per-prompt differences (method - reference, same prompts)."""
    d = [np.asarray(x, dtype=np.float64) for x in diffs if len(x)]
    if not d:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    sizes = np.array([len(x) for x in d])
    estimates = np.empty(n_boot)
    for b in range(n_boot):
        picked = rng.integers(len(d), size=len(d))
        estimates[b] = np.mean([d[s][rng.integers(sizes[s], size=sizes[s])].mean() for s in picked])
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(estimates, [alpha, 1 - alpha])
    return float(lo), float(hi)


def power(diff: float, t_half: float, n: int, confidence: float = 0.95, target: float = 0.8) -> dict:
    """What a paired t design of `n` seeds can detect, from the half-width it achieved.

    ``mde80``: the smallest true effect a two-sided test at 1 - confidence rejects with probability
    `target`, (t_{1-alpha/2} + t_{target}) * s / sqrt(n) on n - 1 degrees of freedom, s the per-seed
    differences' std recovered from the half-width. ``seeds_needed``: seeds at which that smallest effect
    falls to |diff|, the observed effect (normal quantiles; at least 2): what would settle the claim if the
    effect is as large as measured. NaN where the interval is (one seed, no spread)."""
    from scipy import stats

    if n < 2 or not math.isfinite(t_half):
        return {"mde80": math.nan, "seeds_needed": math.nan}
    t_a = stats.t.ppf(0.5 + confidence / 2, df=n - 1)
    sd = t_half * math.sqrt(n) / t_a
    mde = (t_a + stats.t.ppf(target, df=n - 1)) * sd / math.sqrt(n)
    z = stats.norm.ppf(0.5 + confidence / 2) + stats.norm.ppf(target)
    needed = math.inf if abs(diff) <= TIE else max(2, math.ceil((z * sd / abs(diff)) ** 2))
    return {"mde80": float(mde), "seeds_needed": needed}


def verdict(lo: float, hi: float, direction: int = 1) -> str:
    """`reproduced` if [lo, hi] lies on the claimed side of 0 (direction +1: above), `refuted` if on the other."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "not settled"
    lo, hi = (lo, hi) if direction > 0 else (-hi, -lo)
    return "reproduced" if lo > TIE else "refuted" if hi < -TIE else "not settled"


def ratio_verdict(lo: float, hi: float, direction: int = 1) -> str:
    """`verdict` for a ratio's interval [lo, hi], decided on the log scale (the claimed side of 1)."""
    return verdict(math.log(lo) if lo > 0 else math.nan, math.log(hi) if hi > 0 else math.nan, direction)


def margin_verdict(lo: float, hi: float, margin: float, gain: bool) -> str:
    """Equivalence-style verdict for "changes it by less than `margin`": with gain=True the claim is
    that the effect stays below +margin (reproduced if hi < margin, refuted if lo > margin); with
    gain=False that it stays above -margin (reproduced if lo > -margin, refuted if hi < -margin)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "not settled"
    if gain:
        return "reproduced" if hi < margin else "refuted" if lo > margin else "not settled"
    return "reproduced" if lo > -margin else "refuted" if hi < -margin else "not settled"


# --------------------------------------------------------------------------------------------
# What each run contributes
# --------------------------------------------------------------------------------------------


@dataclass
class RunScores:
    """One run's paired measurements: per-prompt validation rewards and per-image CompBench scores."""

    run: str
    seed: int
    base_val: np.ndarray  # the base policy's per-prompt validation reward (same prompts and noise)
    best: np.ndarray  # per-prompt validation reward at the best trained step (chosen on these prompts: biased up)
    final: np.ndarray  # ... at the last step
    early: np.ndarray  # ... at the first validated step after the base (the rise of claim f)
    best_step: int
    compbench: pd.Series | None  # strict score per image file, at the reported checkpoint
    dynamics: pd.DataFrame = field(repr=False, default=None)  # step, grad_norm_ar, grad_var_ar
    selected: np.ndarray | None = None  # per-prompt validation reward at the reported checkpoint (selection.json)
    heldout: np.ndarray | None = None  # ... at the best step chosen on the other half of the prompts (`heldout_best`)


def _val_scores(entry: dict, where: str) -> np.ndarray:
    scores = entry.get("val_scores")
    if not scores:
        raise ValueError(
            f"{where} has no per-prompt val_scores (written by `margrpo train` since the paired "
            "report); retrain the run"
        )
    return np.asarray(scores, dtype=np.float64)


def heldout_best(checkpoints: Sequence[dict], where: str) -> np.ndarray:
    """Per-prompt validation reward at a best step that prompt took no part in choosing (cross-fitting).

    The validation prompts split into two fixed halves, even and odd index. The best trained step on one half
    (highest mean, ties to the earliest, as `select_checkpoint`) scores the prompts of the other, and the other
    way round. The best step scored on the prompts that chose it is a maximum of noisy means, above the base
    even for a run that learned nothing; here the prompts that choose a step never judge it, so the mean is an
    unbiased estimate of what a step chosen by validation is worth. `checkpoints`: a summary.json's list."""
    ckpts = sorted(
        (c for c in checkpoints if c.get("val_reward") is not None and int(c["step"]) > 0), key=lambda c: c["step"]
    )
    if not ckpts:
        raise ValueError(f"{where} has no validated checkpoint")
    rows = [_val_scores(c, where) for c in ckpts]
    if len({r.shape for r in rows}) > 1:
        raise ValueError(f"{where}: its checkpoints were validated on different numbers of prompts")
    scores = np.stack(rows)  # steps x prompts
    if scores.shape[1] < 2:
        raise ValueError(
            f"{where}: {scores.shape[1]} validation prompt(s); the held-out best step needs two halves "
            "(val_prompts >= 2)"
        )
    out = np.empty(scores.shape[1])
    for chooses, judged in ((slice(0, None, 2), slice(1, None, 2)), (slice(1, None, 2), slice(0, None, 2))):
        means = scores[:, chooses].mean(axis=1)
        chosen = int(np.argmax(np.where(np.isfinite(means), means, -np.inf)))  # the first maximum: the earliest step
        out[judged] = scores[chosen, judged]
    return out


def _compbench(root: Path, run: str) -> pd.Series | None:
    return load_compbench_per_image(root, run, required=False)


def load_run(root: str | Path, run: str) -> RunScores:
    root = Path(root)
    summary = load_summary(root, run)
    where = f"{root / run / 'summary.json'}"
    ckpts = [c for c in summary["checkpoints"] if c.get("val_reward") is not None]
    if not ckpts:
        raise ValueError(f"{where} has no validated checkpoint")
    best = max(ckpts, key=lambda c: c["val_reward"])
    final = max(ckpts, key=lambda c: c["step"])
    early = min((c for c in ckpts if c["step"] > 0), key=lambda c: c["step"], default=final)
    base = _val_scores({"val_scores": summary.get("base_val_scores")}, f"{where} (base_val_scores)")
    best_scores, final_scores, early_scores = (
        _val_scores(best, where),
        _val_scores(final, where),
        _val_scores(early, where),
    )
    metrics = load_metrics(root, run)[["step", "grad_norm_ar", "grad_var_ar"]]
    selected = load_selection(root, run, required=False)
    at_selected = None
    if selected is not None:
        match = [c for c in ckpts if int(c["step"]) == int(selected["step"])]
        at_selected = _val_scores(match[0], where) if match else None
    return RunScores(
        run,
        parse_run(run).seed,
        base,
        best_scores,
        final_scores,
        early_scores,
        int(best["step"]),
        _compbench(root, run) if selected is not None else None,
        metrics,
        at_selected,
        heldout_best(ckpts, where) if base.size >= 2 else None,  # one prompt: no halves (val@best-heldout says so)
    )


# --------------------------------------------------------------------------------------------
# Paired differences
# --------------------------------------------------------------------------------------------


def _per_prompt(a: RunScores, b: RunScores | None, metric: str, base_compbench: pd.Series | None) -> np.ndarray:
    """a - b per prompt (val) or per image (compbench); b None = the base policy."""
    if metric == "compbench":
        x = a.compbench
        y = base_compbench if b is None else b.compbench
        if x is None or y is None:
            return np.array([])
        joined = pd.concat([x, y], axis=1, join="inner")
        return (joined.iloc[:, 0] - joined.iloc[:, 1]).to_numpy()
    if metric == "val@final-early":  # a run against itself: from its first validated step to its last
        return a.final - a.early
    pick = {
        "val@best": "best",
        "val@best-heldout": "heldout",
        "val@final": "final",
        "val@early": "early",
        "val@selected": "selected",
    }[metric]
    x = getattr(a, pick)
    y = a.base_val if b is None else getattr(b, pick)
    if x is None or y is None:
        why = (
            "one validation prompt: no two halves to choose the best step on (val_prompts >= 2)"
            if pick == "heldout"
            else "no validated checkpoint at the step its selection.json reports (written by `margrpo select`)"
        )
        raise ValueError(f"{a.run}{'' if b is None else ' or ' + b.run}: {why}")
    if x.shape != y.shape:
        raise ValueError(
            f"{a.run} and {b.run if b else 'its base'} were validated on different prompts ({x.shape} vs {y.shape})"
        )
    return x - y


def difference(
    runs: dict[int, RunScores],
    refs: dict[int, RunScores] | None,
    metric: str,
    confidence: float,
    base_compbench: pd.Series | None = None,
) -> dict:
    """The paired difference of one method against a reference (None = base) over the seeds both have."""
    seeds = sorted(runs if refs is None else set(runs) & set(refs))
    return paired_summary(
        [_per_prompt(runs[s], None if refs is None else refs[s], metric, base_compbench) for s in seeds], confidence
    )


def paired_summary(per_seed: Sequence[np.ndarray], confidence: float) -> dict:
    """Both intervals of a paired difference from each seed's per-unit differences (prompts, images);
    seeds without a unit are left out."""
    kept = [d for d in per_seed if d.size]
    mean, lo, hi, n = paired_t([d.mean() for d in kept], confidence)
    b_lo, b_hi = paired_bootstrap(kept, confidence)
    return {
        "n_seeds": n,
        "n_units": int(sum(d.size for d in kept)),
        "diff": mean,
        "t_lo": lo,
        "t_hi": hi,
        "t_half": (hi - lo) / 2 if n > 1 else math.nan,
        "boot_lo": b_lo,
        "boot_hi": b_hi,
        "per_seed": ";".join(f"{d.mean():+.4f}" for d in kept),
    }


def decide(d: dict, direction: int = 1) -> dict:
    """The interval that decides a `paired_summary` (t over seeds from MIN_SEEDS_FOR_T seeds, else the bootstrap)
    and its verdict."""
    use_t = d["n_seeds"] >= MIN_SEEDS_FOR_T
    lo, hi = (d["t_lo"], d["t_hi"]) if use_t else (d["boot_lo"], d["boot_hi"])
    return {
        "ci": "t over seeds" if use_t else "bootstrap prompts x seeds",
        "lo": lo,
        "hi": hi,
        "verdict": verdict(lo, hi, direction),
    }


def paired_ratio(runs: dict[int, RunScores], refs: dict[int, RunScores], column: str, confidence: float) -> dict:
    """Paired ratio of a per-step statistic over the run: per seed, exp(mean over shared steps of
    log(method / reference)); the t-interval is taken on the log scale over seeds."""
    logs = []
    for s in sorted(set(runs) & set(refs)):
        a = runs[s].dynamics.set_index("step")[column]
        b = refs[s].dynamics.set_index("step")[column]
        joined = pd.concat([a, b], axis=1, join="inner").dropna()
        joined = joined[(joined > 0).all(axis=1)]
        if len(joined):
            logs.append(float(np.log(joined.iloc[:, 0] / joined.iloc[:, 1]).mean()))
    mean, lo, hi, n = paired_t(logs, confidence)
    return {
        "n_seeds": n,
        "diff": math.exp(mean) if n else math.nan,
        "t_lo": math.exp(lo) if n > 1 else math.nan,
        "t_hi": math.exp(hi) if n > 1 else math.nan,
        "per_seed": ";".join(f"{math.exp(x):.3f}" for x in logs),
    }
