"""Reading the result files other stages wrote, and aggregating them over seeds.

Nothing here writes; every loader takes the results root and a run id, and raises
``MissingResultError`` naming the expected file (and the stage that writes it) when a file is
absent. Result layout (design.md §1, ``results/<rule>/<run>/...``):

    <root>/<run>/metrics.csv                  training log, one row per step      (margrpo train)
    <root>/<run>/summary.json                 checkpoints and their val reward    (margrpo train)
    <root>/select/<run>/selection.json        the checkpoint to report            (margrpo select)
    <root>/eval/<run>/compbench.csv           category, n_images, strict, lenient (margrpo eval-compbench)
    <root>/eval/<run>/compbench_per_image.csv file, prompt, ..., strict, lenient  (margrpo eval-compbench)
    <root>/eval/<run>/preference.csv          scorer, mean, std, n                (margrpo eval-preference)
    <root>/samples/<run>/samples/<prompt>_<index:06d>.png                         (margrpo sample)
    <root>/uncertainty/maps.npz               images, uncertainty, prompts[, trajectories]

Run ids: ``base/<policy>``, ``train/<policy>/<reward>/<variant>/seed<s>`` and
``ablation/<policy>/<reward>/<params>/seed<s>`` with ``<params>`` a Paramspace folder name such
as ``top_frac~0.3_tau~0.0_trajectories~4``.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from margrpo.infra.files import InputError, read_json

__all__ = [
    "MissingResultError",
    "RunId",
    "parse_run",
    "parse_params",
    "mean_ci",
    "aggregate_seeds",
    "load_metrics",
    "load_summary",
    "read_summary",
    "check_csv",
    "load_selection",
    "load_compbench",
    "load_compbench_per_image",
    "load_preference",
    "eval_scores",
    "comparable_scores",
    "list_samples",
    "sample_image",
    "load_uncertainty",
    "METRIC_COLUMNS",
    "ABLATION_SYMBOLS",
]

# The per-step training log (design.md §3, "Logged every step"); every column but `step` is optional
# to the readers here, which fill a missing one with NaN.
METRIC_COLUMNS = [
    "step",
    "reward_mean",
    "reward_std",
    "adv_mean",
    "adv_std",
    "frac_zero_std",
    "policy_loss",
    "kl",  # the KL term: read from `kl_paper` (grpo.kl "paper", Eq. 14) where a run logged that (load_metrics)
    "clip_frac",
    "ratio_min",
    "ratio_max",
    "grad_norm_ar",
    "grad_var_ar",
    "lr",
    "wall_time_s",
    "peak_mem_mb",
    "skipped",
    "val_reward",
]

# Ablation parameter (Paramspace column) -> the paper's symbol in Fig. 7.
ABLATION_SYMBOLS = {"top_frac": "k", "tau": "τ", "trajectories": "S"}


class MissingResultError(FileNotFoundError):
    """An expected result file is absent; the message names it and the stage that writes it."""


# --------------------------------------------------------------------------------------------
# Run ids
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunId:
    """A parsed run id. ``variant`` is None for base and ablation runs, ``params`` empty unless ablation."""

    run: str
    kind: str  # base | train | ablation
    policy: str
    reward: str | None = None
    variant: str | None = None
    seed: int | None = None
    params: dict[str, float] = field(default_factory=dict, compare=False, hash=False)


_SEED = re.compile(r"seed(\d+)")


def parse_run(run: str) -> RunId:
    """``train/toy-nova/toyclip/sim/seed0`` -> RunId(kind='train', policy='toy-nova', ...)."""
    parts = run.strip("/").split("/")
    kind = parts[0]
    if kind == "base" and len(parts) == 2:
        return RunId(run, "base", parts[1])
    if kind in ("train", "ablation") and len(parts) == 5 and _SEED.fullmatch(parts[4]):
        seed = int(_SEED.fullmatch(parts[4]).group(1))
        if kind == "train":
            return RunId(run, kind, parts[1], parts[2], parts[3], seed)
        return RunId(run, kind, parts[1], parts[2], None, seed, parse_params(parts[3]))
    raise ValueError(
        f"unrecognised run id {run!r}; expected base/<policy>, train/<policy>/<reward>/<variant>/seed<s> "
        "or ablation/<policy>/<reward>/<params>/seed<s>"
    )


def parse_params(name: str) -> dict[str, float]:
    """Parse a Paramspace folder name: ``top_frac~0.3_tau~-0.1_trajectories~4`` -> {top_frac: 0.3, ...}.

    Names may contain ``_`` but values are numbers (no ``_``), so each ``~``-separated middle
    piece is ``<value>_<next name>``, split at its first ``_``.
    """
    pieces = name.split("~")
    if len(pieces) < 2:
        raise ValueError(f"{name!r} is not a Paramspace folder name (expected e.g. 'top_frac~0.3_tau~0.0')")
    out: dict[str, float] = {}
    key = pieces[0]
    for piece in pieces[1:-1]:
        value, sep, next_key = piece.partition("_")
        if not sep or not next_key:
            raise ValueError(f"cannot parse parameter {key!r} in {name!r}")
        out[key] = float(value)
        key = next_key
    out[key] = float(pieces[-1])
    return out


# --------------------------------------------------------------------------------------------
# Statistics over seeds
# --------------------------------------------------------------------------------------------


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, int]:
    """Mean and half-width of the two-sided t-based confidence interval of the mean.

    half-width = t_{(1+confidence)/2, n-1} * s / sqrt(n), s the sample std (ddof = 1).
    Non-finite values are dropped; n counts the rest. n = 1 gives (value, NaN, 1); n = 0 (NaN, NaN, 0).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x = np.asarray(list(values), dtype=np.float64)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return math.nan, math.nan, 0
    mean = float(x.mean())
    if n == 1:
        return mean, math.nan, 1
    from scipy import stats

    half = float(stats.t.ppf(0.5 + confidence / 2.0, df=n - 1) * x.std(ddof=1) / math.sqrt(n))
    return mean, half, n


def aggregate_seeds(
    frames: Sequence[pd.DataFrame], column: str, confidence: float = 0.95, on: str = "step"
) -> pd.DataFrame:
    """Per-``on`` mean, CI half-width and count of ``column`` across several runs (seeds).

    Rows where the column is NaN (e.g. ``val_reward`` off validation steps) are dropped first, so
    each step averages the seeds that logged it. Returns columns ``[on, mean, ci, n]`` sorted by ``on``.
    """
    pieces = [f[[on, column]].dropna() for f in frames if column in f.columns]
    if not pieces:
        return pd.DataFrame({on: [], "mean": [], "ci": [], "n": []})
    long = pd.concat(pieces, ignore_index=True)
    rows = [(key, *mean_ci(g[column], confidence)) for key, g in long.groupby(on, sort=True)]
    return pd.DataFrame(rows, columns=[on, "mean", "ci", "n"])


# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------


def _require(path: Path, producer: str) -> Path:
    if not path.is_file():
        raise MissingResultError(f"missing result file {path} (written by `{producer}`); run that stage first")
    return path


def _read_json(path: Path, producer: str) -> dict:
    value = read_json(_require(path, producer))  # empty or invalid: InputError naming the file
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object (written by `{producer}`), got {type(value).__name__}")
    return value


def check_csv(path: Path) -> None:
    """A CSV as our writers leave it (atomically, whole): a header, every row as wide as it, the last one ended.
    Else InputError naming the file and line: a cut or edited file never loses a row silently."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}: not UTF-8 text ({err})") from None
    if not text.strip():
        raise InputError(f"{path}: empty (no header); rerun the stage that writes it")
    if not text.endswith("\n"):
        last = text.count("\n") + 1
        raise InputError(f"{path}:{last}: the last row is cut mid-line (no line end); the file was cut or edited")
    reader = csv.reader(io.StringIO(text))
    width = len(next(reader))
    for row in reader:
        if len(row) != width:
            raise InputError(
                f"{path}:{reader.line_num}: {len(row)} fields where the header has {width}; the file was edited"
            )


def _read_csv(path: Path, producer: str, required: Sequence[str]) -> pd.DataFrame:
    check_csv(_require(path, producer))
    try:
        df = pd.read_csv(path, float_precision="round_trip")
    except (ValueError, pd.errors.ParserError) as err:
        raise InputError(f"{path}: not a readable CSV ({str(err).splitlines()[0]})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise InputError(f"{path} lacks column(s) {missing}; it has {list(df.columns)}")
    return df


def load_metrics(root: str | Path, run: str) -> pd.DataFrame:
    """``<root>/<run>/metrics.csv`` sorted by step; absent optional columns are added as NaN."""
    df = _read_csv(Path(root) / run / "metrics.csv", "margrpo train", ["step"])
    if "kl_paper" in df.columns and "kl" not in df.columns:  # the KL term under either name (runs before issue 52: kl)
        df["kl"] = df["kl_paper"]
    for col in METRIC_COLUMNS:
        if col not in df.columns:
            df[col] = np.nan
    return df.sort_values("step", kind="stable").reset_index(drop=True)


def load_summary(root: str | Path, run: str) -> dict:
    return read_summary(Path(root) / run / "summary.json")


def read_summary(path: str | Path) -> dict:
    """A run's summary.json, checked against the metrics.csv beside it: every checkpoint's val_reward must be
    that step's val_reward there (selection reads the one, tables the other; an edit to either is refused)."""
    path = Path(path)
    summary = _read_json(path, "margrpo train")
    if not isinstance(summary.get("checkpoints"), list):
        raise InputError(f"{path}: no checkpoints list (written by `margrpo train`)")
    metrics = path.with_name("metrics.csv")
    if not metrics.is_file():  # a summary on its own (tests, copies): nothing to check against
        return summary
    df = _read_csv(metrics, "margrpo train", ["step"])
    logged = {} if "val_reward" not in df else dict(zip(df["step"].astype(int), df["val_reward"]))
    for c in summary["checkpoints"]:
        val, there = c.get("val_reward"), logged.get(int(c.get("step", -1)), math.nan)
        if isinstance(val, (int, float)) and not math.isclose(val, there, rel_tol=1e-9, abs_tol=1e-12):
            raise InputError(
                f"{path}: checkpoint step {c.get('step')} has val_reward {val}, but {metrics} says {there}; "
                "one of the two was edited: rerun the training stage"
            )
    return summary


def load_selection(root: str | Path, run: str, required: bool = True) -> dict | None:
    """``<root>/select/<run>/selection.json``; with ``required=False`` an absent file gives None."""
    path = Path(root) / "select" / run / "selection.json"
    if not required and not path.is_file():
        return None
    return _read_json(path, "margrpo select")


def load_compbench(root: str | Path, run: str) -> pd.DataFrame:
    """CompBench scores, one row per category, with an ``overall`` row last.

    If the file has no ``overall`` row it is the image-weighted mean of the categories
    (weights ``n_images``).
    """
    path = Path(root) / "eval" / run / "compbench.csv"
    df = _read_csv(path, "margrpo eval-compbench", ["category", "n_images", "strict", "lenient"])
    df["category"] = df["category"].astype(str)
    is_overall = df["category"] == "overall"
    cats = df[~is_overall].reset_index(drop=True)
    if is_overall.any():
        overall = df[is_overall].iloc[[0]]
    else:
        w = cats["n_images"].to_numpy(dtype=np.float64)
        if len(cats) == 0 or w.sum() <= 0:
            raise ValueError(f"{path} has no categories with images to compute the overall score from")
        overall = pd.DataFrame(
            {
                "category": ["overall"],
                "n_images": [int(w.sum())],
                "strict": [float(np.average(cats["strict"], weights=w))],
                "lenient": [float(np.average(cats["lenient"], weights=w))],
            }
        )
    return pd.concat([cats, overall], ignore_index=True)


def load_compbench_per_image(root: str | Path, run: str, required: bool = True) -> pd.Series | None:
    """Strict CompBench score per image file (the index pairs two runs' images of one prompt and index);
    with ``required=False`` an absent file gives None."""
    path = Path(root) / "eval" / run / "compbench_per_image.csv"
    if not required and not path.is_file():
        return None
    df = _read_csv(path, "margrpo eval-compbench", ["file", "strict"])
    return df.set_index("file")["strict"].astype(float)


def load_preference(root: str | Path, run: str) -> pd.DataFrame:
    return _read_csv(Path(root) / "eval" / run / "preference.csv", "margrpo eval-preference", ["scorer", "mean"])


def _eval_entries(root: str | Path, run: str) -> dict[tuple[str, str], tuple[float, float, Path]]:
    """(value, images it averages or NaN, file) of each number a table reports for one run; a blank or non-finite
    value is an InputError naming the run and file (a table would show it as a dash, or average it away)."""
    files = {
        "pref": Path(root) / "eval" / run / "preference.csv",
        "compbench": Path(root) / "eval" / run / "compbench.csv",
    }
    pref, comp = load_preference(root, run), load_compbench(root, run)
    out: dict[tuple[str, str], tuple[float, float, Path]] = {}
    for group, names, values, ns in (
        ("pref", pref["scorer"], pref["mean"], pref.get("n", pd.Series([math.nan] * len(pref)))),
        ("compbench", comp["category"], comp["strict"], comp["n_images"]),
    ):
        for name, value, n in zip(names.astype(str), values, ns):
            value = pd.to_numeric(value, errors="coerce")
            if not math.isfinite(value):
                raise InputError(
                    f"{files[group]}: run {run}: {name} has no finite value ({value}); a table cannot report it"
                )
            if (group, name) in out:
                raise InputError(f"{files[group]}: run {run}: {name} is listed twice")
            out[(group, name)] = (float(value), float(pd.to_numeric(n, errors="coerce")), files[group])
    return out


def eval_scores(root: str | Path, run: str) -> dict[tuple[str, str], float]:
    """The numbers a table reports for one run, in file order.

    Keys ``("pref", scorer)`` -> mean preference score and ``("compbench", category)`` -> strict
    score (``overall`` last).
    """
    return {k: v for k, (v, _, _) in _eval_entries(root, run).items()}


def comparable_scores(root: str | Path, runs: Sequence[str]) -> dict[str, dict[tuple[str, str], float]]:
    """`eval_scores` of each run, checked to compare like with like: the same preference scorers and CompBench
    categories, each over as many images, and (where every run has its per-image CSV) the same image files: one
    prompt suite at one images_per_prompt. Otherwise an InputError naming the run and file that differ."""
    entries = {run: _eval_entries(root, run) for run in dict.fromkeys(runs)}
    if not entries:
        return {}
    ref = next(iter(entries))
    for run, got in entries.items():
        for key, (_, n, path) in entries[ref].items():
            if key not in got:
                file = Path(root) / "eval" / run / path.name
                raise InputError(
                    f"{file}: run {run} has no {key[1]!r} row, which run {ref} has ({path}); "
                    "a table compares every row over the same metrics"
                )
            if not (math.isnan(n) and math.isnan(got[key][1])) and n != got[key][1]:
                raise InputError(
                    f"{got[key][2]}: run {run}: {key[1]!r} averages {got[key][1]:g} images, run {ref} {n:g} ({path}); "
                    "evaluations over other prompts or images per prompt are not comparable"
                )
        extra = [k for k in got if k not in entries[ref]]
        if extra:
            raise InputError(
                f"{got[extra[0]][2]}: run {run} has a {extra[0][1]!r} row, which run {ref} has not; "
                "a table compares every row over the same metrics"
            )
    images = {run: load_compbench_per_image(root, run, required=False) for run in entries}
    if all(v is not None for v in images.values()):
        want = set(images[ref].index)
        for run, got in images.items():
            differ = sorted(set(got.index) ^ want)
            if differ:
                raise InputError(
                    f"{Path(root) / 'eval' / run / 'compbench_per_image.csv'}: run {run} scored other images than run "
                    f"{ref}, e.g. {differ[0]!r}; the runs were not evaluated on the same prompt suite"
                )
    return {run: {k: v for k, (v, _, _) in got.items()} for run, got in entries.items()}


def list_samples(root: str | Path, run: str) -> dict[str, dict[int, Path]]:
    """``<root>/samples/<run>/samples/<prompt>_<index>.png`` -> {prompt: {index: path}}.

    The prompt is everything before the last ``_`` of the file stem (prompts may contain ``_``).
    """
    folder = Path(root) / "samples" / run / "samples"
    if not folder.is_dir():
        raise MissingResultError(
            f"missing samples folder {folder} (written by `margrpo sample`); run that stage first"
        )
    out: dict[str, dict[int, Path]] = {}
    for path in folder.glob("*.png"):
        prompt, sep, index = path.stem.rpartition("_")
        if sep and index.isdigit():
            out.setdefault(prompt, {})[int(index)] = path
    if not out:
        raise MissingResultError(f"no '<prompt>_<index>.png' samples in {folder}")
    return out


def sample_image(samples: dict[int, Path]) -> np.ndarray:
    """The image of index 0 (else the lowest index) as uint8 [H, W, 3]."""
    from PIL import Image

    path = samples[0] if 0 in samples else samples[min(samples)]
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def load_uncertainty(path: str | Path) -> dict[str, Any]:
    """Fig. 4 data: ``images`` uint8 [P, H, W, 3], ``uncertainty`` float [P, h, w], ``prompts`` [P],
    optional ``trajectories`` uint8 [P, S, H, W, 3] (None if absent)."""
    path = _require(Path(path), "margrpo uncertainty")
    with np.load(path, allow_pickle=False) as data:
        missing = [k for k in ("images", "uncertainty", "prompts") if k not in data.files]
        if missing:
            raise ValueError(f"{path} lacks array(s) {missing}; it has {data.files}")
        out = {
            "images": data["images"],
            "uncertainty": data["uncertainty"].astype(np.float32),
            "prompts": [str(p) for p in data["prompts"]],
            "trajectories": data["trajectories"] if "trajectories" in data.files else None,
        }
    if out["uncertainty"].ndim == 2:  # flat [P, L] token order: a square token grid, row-major
        side = math.isqrt(out["uncertainty"].shape[1])
        if side * side != out["uncertainty"].shape[1]:
            raise ValueError(
                f"{path}: uncertainty {out['uncertainty'].shape} is neither [P, h, w] nor a square [P, L]"
            )
        out["uncertainty"] = out["uncertainty"].reshape(-1, side, side)
    p = len(out["prompts"])
    if out["images"].shape[0] != p or out["uncertainty"].shape[0] != p:
        raise ValueError(
            f"{path}: {p} prompts but images {out['images'].shape} and uncertainty {out['uncertainty'].shape}"
        )
    return out
