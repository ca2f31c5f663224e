"""The paper's claims as paired comparisons: one row per claim with its effect, 95% CI and verdict.

Each claim is a paired difference of two methods' runs (`margrpo.reporting.paired`: the intervals, the
verdict, the power), decided per (policy, reward) block of the ladder, and for the ablation grid; a
second seed set decides the ladder's claims again. Writing them out is `margrpo.reporting.claims_markdown`.
The metrics:

- ``val@best-heldout``: validation reward of each run's best validation step, chosen on the other half
  of the prompts (`paired.heldout_best`): every prompt is scored at a step it did not choose. The best
  step scored on the prompts that chose it is a maximum of noisy values, above the truth by an amount
  that differs between variants (their runs' noise over steps differs), so it would tilt the comparisons;
- ``val@final``: validation reward at the last step (does the run end below where it started?);
- ``compbench``: CompBench-style strict accuracy of the checkpoint Table 2 reports (``*`` = best).

    claims(root, {"base": [...], "runs": [...], "variants": [...], "ablations": [...]}) -> Claims
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from margrpo.reporting.checkpoint_gradients import CHECKPOINT_NOTE, checkpoint_gradients
from margrpo.reporting.estimators import CLAIMS_NOTE, estimator_claims, read_block
from margrpo.reporting.paired import (
    MIN_SEEDS_FOR_T,
    RunScores,
    decide,
    difference,
    load_run,
    margin_verdict,
    paired_ratio,
    power,
    ratio_verdict,
)
from margrpo.reporting.results import MissingResultError, load_compbench_per_image, parse_run
from margrpo.reporting.tables import VARIANT_LABELS

__all__ = ["Claims", "claims", "POWER_TARGET"]

POWER_TARGET = 0.02  # the CI half-width the default design aims at for variant - GRPO* on val@best-heldout
# the best step's metric of every claim: chosen on one half of the prompts, scored on the other
BEST = "val@best-heldout"
METRIC_TEXT = {
    "val@best": "validation reward, best step (chosen on the same prompts: biased upward)",
    BEST: "validation reward, best step (chosen on the other half of the prompts)",
    "val@final": "validation reward, last step",
    "val@early": "validation reward, first validated step",
    "val@final-early": "validation reward, last minus first validated step",
    "val@selected": "validation reward, reported checkpoint",
    "compbench": "CompBench overall (strict), reported checkpoint",
}


# --------------------------------------------------------------------------------------------
# Claims
# --------------------------------------------------------------------------------------------


@dataclass
class Claims:
    paired: pd.DataFrame  # every (block, metric, method, reference) paired difference
    claims: pd.DataFrame  # one row per claim
    power: pd.DataFrame  # variant - GRPO* on val@best-heldout: the half-widths the design achieved
    notes: list[str]


def _claim_row(
    block: str, cid: str, statement: str, metric: str, comparison: str, d: dict, confidence: float, direction: int
) -> dict:
    """A claim's row: the paired difference `d` (a `paired_summary`) that tests it, its verdict and its power."""
    return {
        "block": block,
        "claim": cid,
        "statement": statement,
        "metric": metric,
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


class _Block:
    """The ladder runs of one (policy, reward): their paired differences, each computed once and listed
    in `paired`, and the claim rows and power rows they give."""

    def __init__(
        self,
        root: Path,
        policy: str,
        reward: str,
        runs: list,
        variants: Sequence[str] | None,
        confidence: float,
        control: str | None = None,
    ):
        self.name, self.confidence, self.control = f"{policy} / {reward}", confidence, control
        self.by_variant: dict[str, dict[int, RunScores]] = {}
        for r in runs:
            if (r.policy, r.reward) == (policy, reward):
                self.by_variant.setdefault(r.variant, {})[r.seed] = load_run(root, r.run)
        self.base_cb = load_compbench_per_image(root, f"base/{policy}", required=False)
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
        comparison = f"{self.label(method)} - {'base' if ref is None else self.label(ref)}"
        self.rows.append(
            {**_claim_row(self.name, cid, text, metric, comparison, d, self.confidence, direction), **extra}
        )

    def all_pairs(self) -> None:
        """Every variant against GRPO*, +Fix* and the base, on every metric (the claims_paired table)."""
        for metric in (BEST, "val@final", "compbench"):
            for v in self.present:
                for ref in ("grpo", "fix", self.control, None):
                    if ref != v and (ref is None or ref in self.by_variant):
                        self.pair(metric, v, ref)

    def power(self) -> list[dict]:
        """The half-width of variant - GRPO* on val@best-heldout against the target."""
        out = []
        for v in self.present:
            d = self.pair(BEST, v, "grpo") if v != "grpo" and self.has("grpo") else None
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
        for metric, axis in ((BEST, "validation"), ("compbench", "CompBench")):
            for lower, upper in zip(chain, chain[1:]):
                self.claim("a", f"ladder on {axis}: {self.label(upper)} > {self.label(lower)}", metric, upper, lower)

    def frozen_head_gradients(self) -> None:
        """(b) the frozen head lowers the AR gradient's norm and variance (Fig. 2a / 2b)."""
        if not self.has("fix", "grpo"):
            return
        for column, what in (("grad_norm_ar", "AR gradient norm"), ("grad_var_ar", "AR gradient variance")):
            r = paired_ratio(self.by_variant["fix"], self.by_variant["grpo"], column, self.confidence)
            lo, hi = r["t_lo"], r["t_hi"]
            self.rows.append(
                {
                    "block": self.name,
                    "claim": "b",
                    "statement": f"{what} lower with the frozen head (per-step probe)",
                    "metric": f"{column} ratio (geometric mean over steps)",
                    "comparison": "+Fix / GRPO",
                    "n_seeds": r["n_seeds"],
                    "diff": r["diff"],
                    "ci": "t over seeds (log scale)",
                    "lo": lo,
                    "hi": hi,
                    "verdict": ratio_verdict(lo, hi, -1),
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
        """(g) Table 1: RL lifts the reward above the base policy. At the last step, fixed before the runs (the
        best step is above the base by selection alone, being chosen on the same validation prompts)."""
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

    def climbs(self) -> None:
        """(k) RL climbs: every rung ends above the control, the same settings with the advantages shuffled (the
        same seeds' base, prompts and validation noise; update noise without credit). At the last step, fixed
        before the runs: a best step would be above the control by selection alone."""
        if self.control is None or not self.has(self.control):
            return
        for v in self.present:
            if v != self.control:
                self.claim(
                    "k",
                    f"{self.label(v).rstrip('*')} climbs above the {self.label(self.control)} (last step)",
                    "val@final",
                    v,
                    self.control,
                )

    def committed_tokens(self) -> None:
        """(e) beyond the paper: the loss on committed tokens only, against every other variant."""
        if not self.has("committed"):
            return
        for ref in ("grpo", "fix", "mte", "sim"):
            if self.has(ref):
                self.claim("e", f"{self.label('committed')} > {self.label(ref)}", BEST, "committed", ref)


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
        block = _Block(root, policy, reward, runs, spec.get("variants"), confidence, spec.get("control"))
        block.all_pairs()
        power += block.power()
        block.ladder()
        block.frozen_head_gradients()
        block.collapse()
        block.lift()
        block.climbs()
        block.committed_tokens()
        block.head_only()
        paired += block.paired
        rows += block.rows
    rows += _ablation_claims(root, spec.get("ablations") or [], confidence, notes) if with_ablations else []
    if with_ablations and spec.get("estimators"):  # claims h-j: measured at the base, once (report/estimators.md)
        rows += _estimator_claims(root, spec["estimators"], confidence)
        notes.append(CLAIMS_NOTE)
        if any(b.get("checkpoints") for b in spec["estimators"]):  # claim b at trained checkpoints
            found = checkpoint_gradients(root, {"blocks": spec["estimators"]}, confidence)
            rows += found.claims
            notes.append(CHECKPOINT_NOTE)
    notes.append(
        f"{BEST}: {METRIC_TEXT[BEST]}: the best step on the even-index prompts scores the odd ones and the other "
        "way round, so no prompt judges the step it chose (the maximum over steps is biased upward)."
    )
    notes.append(
        f"Verdict: the t-interval over seeds where a comparison has >= {MIN_SEEDS_FOR_T} seeds, else the paired "
        "bootstrap over prompts x seeds (column `ci`); reproduced = the interval lies on the claimed side of 0."
    )
    return Claims(pd.DataFrame(paired), pd.DataFrame(rows), pd.DataFrame(power), notes)


def _ablation_claims(root: Path, runs: Sequence[str], confidence: float, notes: list[str]) -> list[dict]:
    """(d) Fig. 7's shape: k = 0.3 and tau = 0 best, small S enough; each compared with the grid's
    default point (k = 0.3, tau = 0, the grid's most common S: 4 in ours) on val@best-heldout, paired by seed and
    prompt."""
    if not runs:
        return []
    ids = [parse_run(r) for r in runs]
    scores = _ablation_scores(root, ids)
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

    def row(statement: str, d: dict, comparison: str) -> dict:
        return _claim_row(block, "d", statement, BEST, comparison, d, confidence, direction=1)

    for free, sym, fmt in (("top_frac", "k", "{:g}"), ("tau", "tau", "{:g}")):
        for key in scores:
            point = dict(key)
            if key != ckey and all(math.isclose(point[p], center[p]) for p in center if p != free):
                d = difference(scores[ckey], scores[key], BEST, confidence)
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
            d = difference(scores[key], scores[ckey], BEST, confidence)
            S0 = center["trajectories"]
            r = row(
                f"S = {S:g} changes {BEST} by less than {POWER_TARGET} against S = {S0:g}", d, f"S={S:g} - S={S0:g}"
            )
            more = S > center["trajectories"]
            r["verdict"] = margin_verdict(r["lo"], r["hi"], POWER_TARGET, gain=more)
            rows.append(r)
    return rows


def _ablation_scores(root: Path, ids: list) -> dict[tuple, dict[int, RunScores]]:
    """The ablation runs' scores by grid point (its sorted switches) and seed; a run without results is left out."""
    scores: dict[tuple, dict[int, RunScores]] = {}
    for r in ids:
        key = tuple(sorted(r.params.items()))
        try:
            scores.setdefault(key, {})[r.seed] = load_run(root, r.run)
        except MissingResultError:
            continue
    return scores


def _estimator_claims(root: Path, blocks: list[dict], confidence: float) -> list[dict]:
    """Claims h-j of each estimators' block ({"policy", "reward", "dir", "estimators"}: reporting.estimators)."""
    rows = []
    for blk in blocks:
        estimates, _ = read_block(root, blk["dir"], blk["estimators"])
        rows += estimator_claims(estimates, f"{blk['policy']} / {blk['reward']}", confidence)
    return rows
