"""The paper's claims as paired comparisons: one row per claim with its effect, 95% CI and verdict.

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
lies entirely on the other side, and ``not settled`` otherwise. The metrics:

- ``val@best``: validation reward of each run's best validation step (the same rule for every
  variant; biased upwards by the maximum, equally for all);
- ``val@final``: validation reward at the last step (does the run end below where it started?);
- ``compbench``: CompBench-style strict accuracy of the checkpoint Table 2 reports (``*`` = best).

    claims(root, {"base": [...], "runs": [...], "variants": [...], "ablations": [...]}) -> Claims
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from margrpo.infra.io import atomic_write_csv, atomic_write_text
from margrpo.reporting.results import (
    MissingResultError,
    load_compbench_per_image,
    load_metrics,
    load_selection,
    load_summary,
    mean_ci,
    parse_run,
)
from margrpo.reporting.tables import VARIANT_LABELS

__all__ = [
    "paired_t",
    "paired_bootstrap",
    "paired_summary",
    "decide",
    "power",
    "Claims",
    "claims",
    "write_claims",
    "POWER_TARGET",
]

POWER_TARGET = 0.02  # the CI half-width the default design aims at for variant - GRPO* on val@best
MIN_SEEDS_FOR_T = 3
TIE = 1e-9  # differences this small are float round-off of identical runs, not effects
METRIC_TEXT = {
    "val@best": "validation reward, best step",
    "val@final": "validation reward, last step",
    "val@early": "validation reward, first validated step",
    "val@final-early": "validation reward, last minus first validated step",
    "val@selected": "validation reward, reported checkpoint",
    "compbench": "CompBench overall (strict), reported checkpoint",
}


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
    best: np.ndarray  # per-prompt validation reward at the best trained step
    final: np.ndarray  # ... at the last step
    early: np.ndarray  # ... at the first validated step after the base (the rise of claim f)
    best_step: int
    compbench: pd.Series | None  # strict score per image file, at the reported checkpoint
    dynamics: pd.DataFrame = field(repr=False, default=None)  # step, grad_norm_ar, grad_var_ar
    selected: np.ndarray | None = None  # per-prompt validation reward at the reported checkpoint (selection.json)


def _val_scores(entry: dict, where: str) -> np.ndarray:
    scores = entry.get("val_scores")
    if not scores:
        raise ValueError(
            f"{where} has no per-prompt val_scores (written by `margrpo train` since the paired "
            "report); retrain the run"
        )
    return np.asarray(scores, dtype=np.float64)


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
    )


# --------------------------------------------------------------------------------------------
# Differences and claims
# --------------------------------------------------------------------------------------------


@dataclass
class Claims:
    paired: pd.DataFrame  # every (block, metric, method, reference) paired difference
    claims: pd.DataFrame  # one row per claim
    power: pd.DataFrame  # variant - GRPO* on val@best: the half-widths the design achieved
    notes: list[str]


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
    pick = {"val@best": "best", "val@final": "final", "val@early": "early", "val@selected": "selected"}[metric]
    x = getattr(a, pick)
    y = a.base_val if b is None else getattr(b, pick)
    if x is None or y is None:
        raise ValueError(
            f"{a.run}{'' if b is None else ' or ' + b.run}: no validated checkpoint at the step its "
            "selection.json reports (written by `margrpo select`)"
        )
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


def _ratio(runs: dict[int, RunScores], refs: dict[int, RunScores], column: str, confidence: float) -> dict:
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


class _Block:
    """The ladder runs of one (policy, reward): their paired differences, each computed once and listed
    in `paired`, and the claim rows and power rows they give."""

    def __init__(
        self, root: Path, policy: str, reward: str, runs: list, variants: Sequence[str] | None, confidence: float
    ):
        self.name, self.confidence = f"{policy} / {reward}", confidence
        self.by_variant: dict[str, dict[int, RunScores]] = {}
        for r in runs:
            if (r.policy, r.reward) == (policy, reward):
                self.by_variant.setdefault(r.variant, {})[r.seed] = load_run(root, r.run)
        self.base_cb = _compbench(root, f"base/{policy}")
        self.present = [v for v in variants or self.by_variant if v in self.by_variant]
        self.diffs: dict[tuple, dict | None] = {}
        self.paired: list[dict] = []
        self.rows: list[dict] = []

    @staticmethod
    def label(v: str) -> str:
        return VARIANT_LABELS.get(v, v) + ("*" if v in ("grpo", "fix") else "")

    def has(self, *variants: str) -> bool:
        return all(v in self.by_variant for v in variants)

    def pair(self, metric: str, v: str, ref: str | None) -> dict | None:
        """The paired difference v - ref (None: the base policy); None when no seed has both."""
        if (metric, v, ref) not in self.diffs:
            d = difference(
                self.by_variant[v],
                None if ref is None else self.by_variant[ref],
                metric,
                self.confidence,
                self.base_cb,
            )
            self.diffs[(metric, v, ref)] = d if d["n_seeds"] else None
            if d["n_seeds"]:
                self.paired.append(
                    {
                        "block": self.name,
                        "metric": metric,
                        "method": self.label(v),
                        "reference": "base" if ref is None else self.label(ref),
                        **d,
                    }
                )
        return self.diffs[(metric, v, ref)]

    def claim(
        self, cid: str, text: str, metric: str, method: str, ref: str | None, direction: int = 1, **extra
    ) -> None:
        """One claim row: the paired difference method - ref on `metric`, and its verdict for `direction`."""
        d = self.pair(metric, method, ref)
        if d is None:
            return
        self.rows.append(
            {
                "block": self.name,
                "claim": cid,
                "statement": text,
                "metric": metric,
                "comparison": f"{self.label(method)} - {'base' if ref is None else self.label(ref)}",
                "n_seeds": d["n_seeds"],
                "diff": d["diff"],
                **decide(d, direction),
                "t_lo": d["t_lo"],
                "t_hi": d["t_hi"],
                "boot_lo": d["boot_lo"],
                "boot_hi": d["boot_hi"],
                "per_seed": d["per_seed"],
                **power(d["diff"], d["t_half"], d["n_seeds"], self.confidence),
                **extra,
            }
        )

    def all_pairs(self) -> None:
        """Every variant against GRPO*, +Fix* and the base, on every metric (the claims_paired table)."""
        for metric in ("val@best", "val@final", "compbench"):
            for v in self.present:
                for ref in ("grpo", "fix", None):
                    if ref != v and (ref is None or ref in self.by_variant):
                        self.pair(metric, v, ref)

    def power(self) -> list[dict]:
        """The half-width of variant - GRPO* on val@best against the target."""
        out = []
        for v in self.present:
            d = self.pair("val@best", v, "grpo") if v != "grpo" and self.has("grpo") else None
            if d is not None:
                out.append(
                    {
                        "block": self.name,
                        "method": self.label(v),
                        "reference": self.label("grpo"),
                        "n_seeds": d["n_seeds"],
                        "diff": d["diff"],
                        "t_half": d["t_half"],
                        "boot_half": (d["boot_hi"] - d["boot_lo"]) / 2,
                        **power(d["diff"], d["t_half"], d["n_seeds"], self.confidence),
                        "target": POWER_TARGET,
                        "met": bool(d["t_half"] <= POWER_TARGET),
                    }
                )
        return out

    def ladder(self) -> None:
        """(a) the ladder ordering, link by link, on both axes."""
        chain = [v for v in ("grpo", "fix", "mte", "sim") if self.has(v)]
        for metric, axis in (("val@best", "validation"), ("compbench", "CompBench")):
            for lower, upper in zip(chain, chain[1:]):
                self.claim("a", f"ladder on {axis}: {self.label(upper)} > {self.label(lower)}", metric, upper, lower)

    def frozen_head_gradients(self) -> None:
        """(b) the frozen head lowers the AR gradient's norm and variance (Fig. 2a / 2b)."""
        if not self.has("fix", "grpo"):
            return
        for column, what in (("grad_norm_ar", "AR gradient norm"), ("grad_var_ar", "AR gradient variance")):
            r = _ratio(self.by_variant["fix"], self.by_variant["grpo"], column, self.confidence)
            lo, hi = r["t_lo"], r["t_hi"]
            self.rows.append(
                {
                    "block": self.name,
                    "claim": "b",
                    "statement": f"{what} lower with the frozen head",
                    "metric": f"{column} ratio (geometric mean over steps)",
                    "comparison": "+Fix / GRPO",
                    "n_seeds": r["n_seeds"],
                    "diff": r["diff"],
                    "ci": "t over seeds (log scale)",
                    "lo": lo,
                    "hi": hi,
                    "verdict": verdict(math.log(lo) if lo > 0 else math.nan, math.log(hi) if hi > 0 else math.nan, -1),
                    "t_lo": lo,
                    "t_hi": hi,
                    "boot_lo": math.nan,
                    "boot_hi": math.nan,
                    "per_seed": r["per_seed"],
                }
            )

    def collapse(self) -> None:
        """(c) end-to-end GRPO collapses where +Fix does not."""
        if not self.has("fix", "grpo"):
            return
        below = {
            v: sum(float(s.final.mean()) < float(s.base_val.mean()) for s in self.by_variant[v].values())
            for v in self.present
        }
        counts = ", ".join(f"{self.label(v).rstrip('*')} {below[v]}/{len(self.by_variant[v])}" for v in self.present)
        self.claim(
            "c",
            "end-to-end GRPO ends lower than +Fix (seeds ending below the base: " + counts + ")",
            "val@final",
            "fix",
            "grpo",
            seeds_below_base=counts,
        )
        self.claim(
            "c",
            "end-to-end GRPO ends below the base policy",
            "val@final",
            "grpo",
            None,
            direction=-1,
            seeds_below_base=counts,
        )

    def lift(self) -> None:
        """(g) Table 1: RL lifts the reward above the base policy. At the last step, fixed before the runs (the best step
        is above the base by selection alone, being chosen on the same validation prompts)."""
        for v in ("fix", "sim"):
            if self.has(v):
                self.claim(
                    "g",
                    f"{self.label(v).rstrip('*')} lifts the validation reward above the base policy (last step)",
                    "val@final",
                    v,
                    None,
                )

    def head_only(self) -> None:
        """(f) Appendix C.1 / Fig. 10: RL on the head alone (AR frozen) rises briefly, then falls. Tested on
        fixed steps, not the best one (a maximum over steps is above the base by selection alone): the first
        validated step against the base, then the last against the first, within each run."""
        if not self.has("head"):
            return
        self.claim(
            "f", "RL on the head alone rises first (first validated step above the base)", "val@early", "head", None
        )
        self.claim(
            "f",
            "... then falls (last validated step below the first)",
            "val@final-early",
            "head",
            None,
            direction=-1,
            comparison=f"{self.label('head')}: last - first validated step",
        )

    def committed_tokens(self) -> None:
        """(e) beyond the paper: the loss on committed tokens only, against every other variant."""
        if not self.has("committed"):
            return
        for ref in ("grpo", "fix", "mte", "sim"):
            if self.has(ref):
                self.claim("e", f"{self.label('committed')} > {self.label(ref)}", "val@best", "committed", ref)


def claims(root: str | Path, spec: dict, confidence: float = 0.95) -> Claims:
    """``spec = {"base": [base/<policy>...], "runs": [train/... ladder runs], "variants": [...],
    "ablations": [ablation/... runs], "replicate_seeds": [...], ...}``: every claim of the paper the runs can test.
    With `replicate_seeds`, the ladder's claims are decided on the other seeds and again on these (the `replicate_*`
    columns), and `both` says what the two decisions agree on: a claim counts as reproduced only in both."""
    root = Path(root)
    runs = [parse_run(r) for r in spec["runs"]]
    second = set(spec.get("replicate_seeds") or [])
    first = _decide_claims(root, [r for r in runs if r.seed not in second], spec, confidence, with_ablations=True)
    if not second:
        return first
    again = _decide_claims(root, [r for r in runs if r.seed in second], spec, confidence, with_ablations=False)
    return _with_replicate(first, again, sorted(second))


REPLICATE_COLUMNS = ("n_seeds", "diff", "lo", "hi", "verdict", "mde80")


def _with_replicate(first: Claims, second: Claims, seeds: list[int]) -> Claims:
    """The first seed set's claims with the second set's decision of each beside it, and `both`: the verdict where
    the two agree, else "differs" (ablation claims have no second set)."""
    key = ["block", "claim", "metric", "comparison"]
    again = second.claims[key + list(REPLICATE_COLUMNS)].rename(
        columns={c: f"replicate_{c}" for c in REPLICATE_COLUMNS}
    )
    rows = first.claims.merge(again, on=key, how="left")
    rows["both"] = [
        ("–" if not isinstance(b, str) else a if a == b else "differs")
        for a, b in zip(rows["verdict"], rows["replicate_verdict"])
    ]
    notes = first.notes + [
        f"Second seed set: seeds {', '.join(map(str, seeds))}, decided alone (columns `replicate_*`); "
        "`both` is the verdict where the two sets agree, else `differs`: only `reproduced` there counts."
    ]
    return Claims(first.paired, rows, first.power, notes)


def _decide_claims(root: Path, runs: list, spec: dict, confidence: float, with_ablations: bool) -> Claims:
    """The claims that these ladder runs (one seed set) and, `with_ablations`, the ablation runs decide."""
    if not runs:
        raise ValueError("claims: no ladder runs given")
    paired, rows, power, notes = [], [], [], []
    for policy, reward in dict.fromkeys((r.policy, r.reward) for r in runs):
        block = _Block(root, policy, reward, runs, spec.get("variants"), confidence)
        block.all_pairs()
        power += block.power()
        block.ladder()
        block.frozen_head_gradients()
        block.collapse()
        block.lift()
        block.committed_tokens()
        block.head_only()
        paired += block.paired
        rows += block.rows
    rows += _ablation_claims(root, spec.get("ablations") or [], confidence, notes) if with_ablations else []
    notes.append(
        f"Verdict: the t-interval over seeds where a comparison has >= {MIN_SEEDS_FOR_T} seeds, else the paired "
        "bootstrap over prompts x seeds (column `ci`); reproduced = the interval lies on the claimed side of 0."
    )
    return Claims(pd.DataFrame(paired), pd.DataFrame(rows), pd.DataFrame(power), notes)


def _ablation_claims(root: Path, runs: Sequence[str], confidence: float, notes: list[str]) -> list[dict]:
    """(d) Fig. 7's shape: k = 0.3 and tau = 0 best, small S enough; each compared with the grid's
    default point (k = 0.3, tau = 0, the grid's most common S: 4 in ours) on val@best, paired by seed and prompt."""
    if not runs:
        return []
    ids = [parse_run(r) for r in runs]
    scores: dict[tuple, dict[int, RunScores]] = {}
    for r in ids:
        key = tuple(sorted(r.params.items()))
        try:
            scores.setdefault(key, {})[r.seed] = load_run(root, r.run)
        except MissingResultError:
            continue
    S_values = [dict(k).get("trajectories") for k in scores]
    center = {
        "top_frac": 0.3,
        "tau": 0.0,
        "trajectories": max(set(S_values), key=S_values.count),
    }  # the paper's k, tau
    ckey = tuple(sorted(center.items()))
    if ckey not in scores:
        notes.append(
            f"(d) not tested: the ablation grid lacks the point k = 0.3, tau = 0, S = {center['trajectories']:g}"
        )
        return []
    rows = []
    block = f"{ids[0].policy} / {ids[0].reward} (ablation, {ids[0].variant or 'sim'})"

    def row(statement: str, d: dict, comparison: str, direction: int = 1) -> dict:
        return {
            "block": block,
            "claim": "d",
            "statement": statement,
            "metric": "val@best",
            "comparison": comparison,
            "n_seeds": d["n_seeds"],
            "diff": d["diff"],
            **decide(d, direction),
            "t_lo": d["t_lo"],
            "t_hi": d["t_hi"],
            "boot_lo": d["boot_lo"],
            "boot_hi": d["boot_hi"],
            "per_seed": d["per_seed"],
            **power(d["diff"], d["t_half"], d["n_seeds"], confidence),
        }

    for free, sym, fmt in (("top_frac", "k", "{:g}"), ("tau", "tau", "{:g}")):
        for key in scores:
            point = dict(key)
            if key != ckey and all(math.isclose(point[p], center[p]) for p in center if p != free):
                d = difference(scores[ckey], scores[key], "val@best", confidence)
                rows.append(
                    row(
                        f"{sym} = {fmt.format(center[free])} beats {sym} = {fmt.format(point[free])}",
                        d,
                        f"{sym}={fmt.format(center[free])} - {sym}={fmt.format(point[free])}",
                    )
                )
    # "small S is enough": against S = 4, more trajectories gain less than the margin and fewer lose less
    for key in scores:
        point = dict(key)
        S = point["trajectories"]
        if 1 < S != center["trajectories"] and all(math.isclose(point[p], center[p]) for p in ("top_frac", "tau")):
            d = difference(scores[key], scores[ckey], "val@best", confidence)
            S0 = center["trajectories"]
            r = row(
                f"S = {S:g} changes val@best by less than {POWER_TARGET} against S = {S0:g}", d, f"S={S:g} - S={S0:g}"
            )
            more = S > center["trajectories"]
            r["verdict"] = margin_verdict(r["lo"], r["hi"], POWER_TARGET, gain=more)
            rows.append(r)
    return rows


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _fmt(x: float, digits: int = 3) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:+.{digits}f}"


def _abs(x: float) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.3f}"


def to_markdown(c: Claims) -> str:
    out = [
        "**Claims.** Each row: a claim of the paper (a-d, f) or beyond it (e), the paired difference that tests it "
        "(mean over seeds), the 95% interval that decides it and the verdict. " + " ".join(c.notes),
        "",
        "Power: `half` is the 95% interval's half-width (t over seeds), `MDE80` the smallest effect this many seeds "
        "detect with 80% power, `seeds to settle` the seeds at which MDE80 falls to the measured effect.",
        "",
        "| block | claim | statement | comparison | metric | seeds | effect | 95% CI | CI | verdict | half | MDE80 | seeds to settle |"
        + (" second set: seeds | effect | 95% CI | verdict | MDE80 | **both** |" if "both" in c.claims else ""),
        "|:---|:---|:---|:---|:---|---:|---:|:---|:---|:---|---:|---:|---:|"
        + ("---:|---:|:---|:---|---:|:---|" if "both" in c.claims else ""),
    ]
    for r in c.claims.to_dict("records"):
        ratio = r["claim"] == "b"
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
        out.append(
            f"| {r['block']} | {r['claim']} | {r['statement']} | {r['comparison']} | {r['metric']} | "
            f"{r['n_seeds']} | {eff} | {ci} | {r['ci']} | **{r['verdict']}** | {_abs(half)} | {_abs(np.nan if ratio else mde)} | {settle} |"
            + (_replicate_cells(r, ratio) if "both" in r else "")
        )
    if len(c.power):
        out += [
            "",
            f"**Power.** 95% CI half-width of variant - GRPO* on the validation reward at the best step "
            f"(target <= {POWER_TARGET}) and the smallest effect detected with 80% power:",
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
