"""Each rung's gradient estimator measured against the exact gradient at the base policy: noise, signal, cost.

Input: one `batches.json` per estimator (`margrpo gradient-estimator`), all over the same B batch seeds (the same
rollouts for +Fix, +MTE, +Sim, `committed` and every-step credit; MTE's extra trajectories from their own stream),
each holding what the statistics need of the B batch gradients g_b (ascent directions): their Gram matrix
K = G G^T, their projections on the exact gradient's unit direction u (p_b = g_b . u), CPU seconds per batch. From
those alone, on any resample of the batch seeds:

- noise  tr Cov g = mean |g_b|^2 - |E g|^2, with |E g|^2 the mean of g_b . g_c over pairs of distinct batch seeds
  (b != c: unbiased, and still so on a bootstrap resample, whose repeats are not distinct); without repeats this is
  (tr K - 1^T K 1 / B) / (B - 1);
- the cosine of the mean of the B batches with the exact direction, mean(p) / |mean g|;
- the signal per batch |E g|^2 / tr Cov g (|E g|^2 as above: |mean g|^2 - tr Cov g / B without repeats);
- the batches (and images) whose mean reaches a cosine of 0.5 with the exact direction: n = tr Cov g /
  (4 a^2 - |E g|^2), a = E p (the signal along the exact direction), where 4 a^2 > |E g|^2; and the fewest any
  estimator needs whose projection is within a's interval, tr Cov g / (3 a_hi^2) (a gradient all along the exact
  direction, a at the interval's upper end): the bound where no signal is detected;
- the signal per CPU-second a |a| / (tr Cov g * CPU-s per batch): the squared cosine with the exact direction that
  one CPU-second of batches buys while it is small, signed by a (a scale-free number: the pathwise estimator's
  reward gradient and the GRPO loss gradients compare on it).

Paired comparisons (claims h, i, j) resample the batch seeds once for every estimator of a comparison (the paired
bootstrap), so the shared rollouts' variation cancels.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy.stats import norm

from margrpo.infra.files import atomic_save_figure, atomic_write_csv, atomic_write_text
from margrpo.reporting.paired import ratio_verdict, verdict

LABELS = {
    "fix": "+Fix",
    "mte": "+MTE",
    "sim": "+Sim",
    "committed": "committed",
    "every_step": "every step credited",
    "pathwise": "pathwise (DRaFT-like)",
}
N_BOOT = 4000


@dataclass
class Batches:
    """One estimator's B batch gradients, as the statistics read them (see the module docstring)."""

    name: str
    gram: np.ndarray  # [B, B] float64
    proj: np.ndarray  # [B]: each batch's ascent direction on the exact gradient's unit direction
    cpu_s: np.ndarray  # [B]
    images: int  # per batch
    loss_gradient: bool  # a GRPO loss's gradient (one scale), or the pathwise reward gradient (another)
    ids: np.ndarray | None = None  # each row's batch seed (a resample repeats some); None: 0..B-1

    def __post_init__(self):
        if self.ids is None:
            self.ids = np.arange(len(self.proj))

    @classmethod
    def read(cls, path: str | os.PathLike) -> Batches:
        d = json.loads(Path(path).read_text())
        try:
            gram, proj = np.array(d["gram"], dtype=np.float64), np.array(d["proj"], dtype=np.float64)
            out = cls(
                d["estimator"],
                gram,
                proj,
                np.array(d["cpu_s"], dtype=np.float64),
                int(d["images"]),
                bool(d["loss_gradient"]),
            )
        except KeyError as err:
            raise ValueError(f"{path}: no {err} (not a `margrpo gradient-estimator` output?)") from None
        if gram.shape != (len(proj), len(proj)) or len(out.cpu_s) != len(proj):
            raise ValueError(f"{path}: gram {gram.shape}, proj {proj.shape}, cpu_s {out.cpu_s.shape} do not agree")
        return out

    def __len__(self) -> int:
        return len(self.proj)

    def take(self, idx: np.ndarray) -> Batches:
        """The same estimator on a resample of its batch seeds (indices, repeats allowed)."""
        return Batches(
            self.name,
            self.gram[np.ix_(idx, idx)],
            self.proj[idx],
            self.cpu_s[idx],
            self.images,
            self.loss_gradient,
            self.ids[idx],
        )


def _div(a: float, b: float) -> float:
    """a / b, NaN where b is 0 (a resample that drew one batch seed throughout has no spread)."""
    return a / b if b else math.nan


def signal_square(b: Batches) -> float:
    """|E g|^2: the mean of g_b . g_c over pairs of distinct batch seeds (may come out negative where the signal is
    below the noise's reach)."""
    distinct = b.ids[:, None] != b.ids[None, :]
    return _div(float(b.gram[distinct].sum()), float(distinct.sum()))


def noise(b: Batches) -> float:
    """tr Cov g: the batch gradient's total variance, E|g|^2 - |E g|^2."""
    return float(np.diag(b.gram).mean()) - signal_square(b)


def mean_square(b: Batches) -> float:
    """|mean g|^2."""
    return float(b.gram.sum() / len(b) ** 2)


def snr(b: Batches) -> float:
    """|E g|^2 / tr Cov g per batch."""
    return _div(signal_square(b), noise(b))


def projection(b: Batches) -> float:
    """The mean projection of the batches' ascent directions on the exact direction (a = E p)."""
    return float(b.proj.mean())


def cos_mean(b: Batches) -> float:
    """The cosine of the mean of the batches with the exact direction."""
    return _div(projection(b), math.sqrt(mean_square(b)))


def batches_for_cosine(b: Batches, a: float, target: float = 0.5) -> float:
    """Batches whose mean has cosine `target` with the exact direction, for signal `a` along it (inf: never)."""
    full = max(signal_square(b), a * a)  # |E g| is at least its component along the exact direction
    reach = a * a / target**2 - full
    return _div(noise(b), reach) if a > 0 and reach > 0 else math.inf


def signal_per_cpu(b: Batches) -> float:
    """a |a| / (tr Cov g * CPU-s per batch), a = mean projection: cos^2 with the exact direction per CPU-second."""
    a = projection(b)
    return _div(a * abs(a), noise(b) * float(b.cpu_s.mean()))


def bootstrap(stat, estimates: list[Batches], confidence: float, n_boot: int = N_BOOT, seed: int = 0):
    """`stat(*estimates)` and its paired-bootstrap interval: every estimate is resampled with the same batch seeds;
    bias-corrected percentiles (BC: a resample's duplicates bias a variance low, and the correction undoes it).
    Returns (value, lo, hi)."""
    n = len(estimates[0])
    if any(len(e) != n for e in estimates):
        raise ValueError(f"paired estimates over different batch counts: {[len(e) for e in estimates]}")
    value = stat(*estimates)
    rng = np.random.default_rng(seed)
    draws = np.array([stat(*(e.take(idx) for e in estimates)) for idx in rng.integers(0, n, size=(n_boot, n))])
    return (value, *bc_interval(value, draws, confidence, n_boot))


def bc_interval(value: float, draws: np.ndarray, confidence: float, n_boot: int) -> tuple[float, float]:
    """The bias-corrected percentile interval of `value` from its bootstrap `draws` (non-finite draws left out;
    NaN where fewer than half of the n_boot draws are finite)."""
    draws = draws[np.isfinite(draws)]
    if len(draws) < n_boot / 2 or not math.isfinite(value):
        return math.nan, math.nan
    below = (np.sum(draws < value) + 0.5 * np.sum(draws == value)) / len(draws)
    z0, z = norm.ppf(np.clip(below, 1 / len(draws), 1 - 1 / len(draws))), norm.ppf(0.5 + confidence / 2)
    lo, hi = np.quantile(draws, norm.cdf([2 * z0 - z, 2 * z0 + z]))
    return float(lo), float(hi)


def describe(b: Batches, confidence: float) -> dict:
    """One estimator's row of estimators.csv."""
    B, a, se = len(b), projection(b), float(b.proj.std(ddof=1) / math.sqrt(len(b)))
    z = float(norm.ppf(0.5 + confidence / 2))
    tr, tr_lo, tr_hi = bootstrap(noise, [b], confidence)
    s, s_lo, s_hi = bootstrap(snr, [b], confidence)
    spc, spc_lo, spc_hi = bootstrap(signal_per_cpu, [b], confidence)
    need = batches_for_cosine(b, a) if a - z * se > 0 else math.inf  # a point only where the signal is detected
    top = a + z * se  # the most signal along the exact direction the interval allows
    at_least = _div(noise(b), 3 * top * top) if top > 0 else math.inf  # all of E g along it: the fewest batches
    return {
        "estimator": b.name,
        "label": LABELS.get(b.name, b.name),
        "gradient": "GRPO loss" if b.loss_gradient else "reward (pathwise)",
        "batches": B,
        "images_per_batch": b.images,
        "noise_trcov": tr,
        "noise_lo": tr_lo,
        "noise_hi": tr_hi,
        "proj_mean": a,
        "proj_se": se,
        "rms_norm": math.sqrt(float(np.trace(b.gram)) / B),
        "cos_mean_exact": cos_mean(b),
        "snr_per_batch": s,
        "snr_lo": s_lo,
        "snr_hi": s_hi,
        "images_for_cos_half": need * b.images,
        "images_for_cos_half_at_least": at_least * b.images,
        "cpu_s_per_batch": float(b.cpu_s.mean()),
        "cpu_s_se": float(b.cpu_s.std(ddof=1) / math.sqrt(B)),
        "signal_per_cpu_s": spc,
        "signal_per_cpu_lo": spc_lo,
        "signal_per_cpu_hi": spc_hi,
    }


def ratio_of(stat):
    """stat(a) / stat(b): a paired ratio of two estimators' statistic."""
    return lambda a, b: _div(stat(a), stat(b))


def difference_of(stat):
    return lambda a, b: stat(a) - stat(b)


def noise_per_cpu(b: Batches) -> float:
    """tr Cov g x CPU-s per batch: the noise left after one CPU-second of batches is averaged. Between estimators of
    one expectation, its ratio is the inverse ratio of their signal per CPU-second."""
    return noise(b) * float(b.cpu_s.mean())


class Claim(NamedTuple):
    claim: str
    statement: str
    metric: str
    estimator: str
    reference: str
    statistic: Callable[[Batches], float]
    ratio: bool  # estimator / reference (decided on the log scale), else estimator - reference
    direction: int  # the claimed side: -1 lower, +1 higher


# fmt: off
CLAIMS = [
    Claim("h", "+MTE lowers the AR batch gradient's noise", "tr Cov g ratio", "mte", "fix", noise, True, -1),
    Claim("i", "+Sim's selection lowers the batch gradient's noise", "tr Cov g ratio", "sim", "fix", noise, True, -1),
    Claim("i", "+Sim's selection raises the signal along the exact gradient", "projection on the exact direction",
          "sim", "fix", projection, False, 1),
    Claim("j", "crediting every AR and diffusion step lowers the noise", "tr Cov g ratio", "every_step", "fix",
          noise, True, -1),
    Claim("j", "crediting every step buys more signal per CPU-second", "signal per CPU-s (cos^2, signed)",
          "every_step", "fix", signal_per_cpu, False, 1),
    Claim("j", "crediting every step leaves less noise per CPU-second (one expectation: more signal per CPU-s)",
          "tr Cov g x CPU-s per batch ratio", "every_step", "fix", noise_per_cpu, True, -1),
]
# fmt: on


def estimator_claims(estimates: dict[str, Batches], block: str, confidence: float) -> list[dict]:
    """Claims h, i, j as rows of the claims table: paired over the batch seeds, each with its interval from the paired
    bootstrap (`bootstrap`) and the verdict rule of every claim (a ratio's on the log scale)."""
    rows = []
    for cid, statement, metric, est, ref, stat, ratio, direction in CLAIMS:
        if est not in estimates or ref not in estimates:
            continue
        a, b = estimates[est], estimates[ref]
        value, lo, hi = bootstrap(ratio_of(stat) if ratio else difference_of(stat), [a, b], confidence)
        decided = (ratio_verdict if ratio else verdict)(lo, hi, direction)
        rows.append(
            {
                "block": block,
                "claim": cid,
                "statement": statement + " (at the base policy)",
                "metric": metric,
                "comparison": f"{LABELS[est]} {'/' if ratio else '-'} {LABELS[ref]}",
                "n_seeds": len(a),
                "diff": value,
                "ci": "paired bootstrap over batch seeds",
                "lo": lo,
                "hi": hi,
                "verdict": decided,
                "t_lo": math.nan,
                "t_hi": math.nan,
                "boot_lo": lo,
                "boot_hi": hi,
                "per_seed": "",
            }
        )
    return rows


CLAIMS_NOTE = (
    "Claims h-j are measured at the base policy, not over training: B batch gradients of each estimator over the same "
    "batch seeds (the `seeds` column counts batch seeds), against the exact gradient of the expected reward "
    "(report/estimators.md); their intervals are the paired bootstrap over batch seeds. GRPO's AR part equals "
    "+Fix's at the base (the same rollouts and loss; its head gradient is the rest), so it has no row of its own. "
    "+Fix and every step credited have one expectation (the loss's mean over uniformly drawn AR and diffusion steps "
    "is an unbiased part of its mean over all of them), so their noise x CPU ratio is the inverse of their signal "
    "per CPU-second where the signal itself is below what the batches detect."
)


def read_block(root: Path, folder: str, names: list[str]) -> tuple[dict[str, Batches], dict]:
    """The estimators of one (policy, reward) and its exact gradient's record (exact.json)."""
    estimates = {n: Batches.read(root / folder / n / "batches.json") for n in names}
    return estimates, json.loads((root / folder / "exact.json").read_text())


@dataclass
class EstimatorReport:
    data: pd.DataFrame  # one row per (block, estimator)
    claims: list[dict]
    exact: dict[str, dict]  # block -> its exact gradient's record
    confidence: float

    def to_markdown(self) -> str:
        out = [
            "**Gradient estimators at the base policy.** Each estimator's batch gradients over the same batch seeds, "
            "against the exact (pathwise) gradient of the expected reward. `noise` is tr Cov g (the GRPO loss's "
            "units; the pathwise rows are a reward gradient, another scale), `projection` the mean of each batch's "
            "ascent direction on the exact direction (+- s.e.), `cos` the mean of all batches' cosine with it, "
            "`SNR` |E g|^2 / tr Cov g per batch, `images for cos 0.5` what one averaged update needs (`>=`: a bound "
            "from the projection's interval where no signal is detected), `signal / CPU-s` the squared cosine one "
            f"CPU-second of batches buys (signed). Intervals: {self.confidence:.0%}, bootstrap over batch seeds.",
            "",
        ]
        for block, e in self.exact.items():
            c = e["half_cos"]  # halves s + n1, s + n2 of equal noise: their mean has cosine sqrt(2c / (1 + c)) with s
            pinned = f"{math.sqrt(2 * c / (1 + c)):.2f}" if c > 0 else "unknown (halves not aligned)"
            out.append(
                f"Exact gradient of {block}: {e['images']} images in {e['parts']} parts, |grad| {e['norm']:.4g}, "
                f"cosine between its halves {c:+.3f} (so its cosine with the true gradient is about {pinned}), "
                f"{e['cpu_s']:.0f} CPU-s."
            )
        out += [
            "",
            "| block | estimator | batches x images | noise tr Cov g [CI] | projection | cos | SNR per batch [CI] "
            "| images for cos 0.5 | CPU-s / batch | signal / CPU-s [CI] |",
            "|:---|:---|---:|:---|:---|---:|:---|:---|---:|:---|",
        ]
        for r in self.data.to_dict("records"):
            out.append(
                f"| {r['block']} | {r['label']} | {r['batches']} x {r['images_per_batch']} | "
                f"{r['noise_trcov']:.4g} [{r['noise_lo']:.4g}, {r['noise_hi']:.4g}] | "
                f"{r['proj_mean']:+.4g} +- {r['proj_se']:.2g} | {r['cos_mean_exact']:+.3f} | "
                f"{r['snr_per_batch']:+.2e} [{r['snr_lo']:+.1e}, {r['snr_hi']:+.1e}] | {_images(r)} | "
                f"{r['cpu_s_per_batch']:.2f} | {r['signal_per_cpu_s']:+.2e} [{r['signal_per_cpu_lo']:+.1e}, "
                f"{r['signal_per_cpu_hi']:+.1e}] |"
            )
        out += [
            "",
            "| block | claim | statement | comparison | effect | 95% CI | verdict |",
            "|:---|:---|:---|:---|---:|:---|:---|",
        ]
        for c in self.claims:
            out.append(
                f"| {c['block']} | {c['claim']} | {c['statement']} | {c['comparison']} | {c['diff']:+.4g} | "
                f"[{c['lo']:+.4g}, {c['hi']:+.4g}] | **{c['verdict']}** |"
            )
        return "\n".join(out + ["", CLAIMS_NOTE]) + "\n"

    def figure(self):
        """Noise against CPU per batch (the GRPO loss's estimators: one scale), and signal per CPU-second (all)."""
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        rows = self.data.to_dict("records")
        label = (lambda r: f"{r['label']} ({r['block']})") if len(self.exact) > 1 else (lambda r: r["label"])
        for r in rows:
            if r["gradient"] == "GRPO loss":
                v = r["noise_trcov"]  # a log axis: an interval reaching 0 is drawn to a tenth of the value
                yerr = [[v - max(r["noise_lo"], v / 10)], [r["noise_hi"] - v]]
                left.errorbar(
                    r["cpu_s_per_batch"], v, yerr=yerr, xerr=1.96 * r["cpu_s_se"], fmt="o", capsize=3, label=label(r)
                )
        left.set(
            xlabel="CPU-s per batch",
            ylabel="noise tr Cov g (GRPO loss)",
            yscale="log",
            title="batch gradient noise against its cost",
        )
        left.legend(fontsize=7, loc="best")
        value = np.array([r["signal_per_cpu_s"] for r in rows])
        lo = np.array([r["signal_per_cpu_lo"] for r in rows])
        hi = np.array([r["signal_per_cpu_hi"] for r in rows])
        scale = float(np.nanmax(np.abs(value))) or 1.0
        span = min(float(np.nanmax(np.abs(np.r_[lo, hi, value]))), 1e3 * scale)  # a degenerate interval is cut
        y = np.arange(len(rows))
        err = np.nan_to_num(np.clip(np.stack([value - lo, hi - value]), 0, 2 * span))
        right.errorbar(value, y, xerr=err, fmt="o", capsize=3)
        right.axvline(0, color="grey", lw=0.8)
        right.set_yticks(y, [label(r) for r in rows])
        right.set_xscale("symlog", linthresh=scale / 100)
        right.set(
            xlim=(-1.1 * span, 1.1 * span),
            xlabel="signal per CPU-s (cos² with the exact gradient, signed)",
            title="what a CPU-second of batches buys",
        )
        fig.tight_layout()
        return fig

    def write(self, prefix: str | os.PathLike, formats=("png", "pdf")) -> list[Path]:
        prefix = os.fspath(prefix)
        paths = [atomic_write_csv(self.data, f"{prefix}.csv"), atomic_write_text(f"{prefix}.md", self.to_markdown())]
        figure = self.figure()
        paths += atomic_save_figure(figure, os.path.join(os.path.dirname(prefix), "fig_estimators"), formats)
        import matplotlib.pyplot as plt

        plt.close(figure)
        return paths


def _images(r: dict) -> str:
    if math.isfinite(r["images_for_cos_half"]):
        return f"{r['images_for_cos_half']:.3g}"
    bound = r["images_for_cos_half_at_least"]
    return f">= {bound:.3g}" if math.isfinite(bound) else "never (no signal)"


def estimators(root: str | Path, spec: dict, confidence: float = 0.95) -> EstimatorReport:
    """``spec = {"blocks": [{"policy", "reward", "dir": "estimators/<policy>/<reward>", "estimators": [...]}]}``
    (folders relative to the results root `root`)."""
    root, rows, claims, exact = Path(root), [], [], {}
    if not spec.get("blocks"):
        raise ValueError("report estimators: the runs JSON needs 'blocks'")
    for blk in spec["blocks"]:
        name = f"{blk['policy']} / {blk['reward']}"
        estimates, exact[name] = read_block(root, blk["dir"], blk["estimators"])
        rows += [{"block": name, **describe(b, confidence)} for b in estimates.values()]
        claims += estimator_claims(estimates, name, confidence)
    return EstimatorReport(pd.DataFrame(rows), claims, exact, confidence)
