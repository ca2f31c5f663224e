"""Tables from a synthetic results tree (tests/results_tree.py; no training: every number is planted there): the
results helpers, Tables 1 and 2 and the validation gains, the CLI's `report table2`. The figures:
test_reporting_figures.py."""

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from results_tree import (
    BASE_VAL,
    CATEGORIES,
    POLICY,
    PROMPTS,
    REWARD,
    SEEDS,
    VARIANTS,
    planted_strict,
    write_eval,
    write_metrics,
)
from scipy import stats

from margrpo.cli import main
from margrpo.infra.files import atomic_write_json
from margrpo.reporting import tables
from margrpo.reporting.results import (
    MissingResultError,
    aggregate_seeds,
    eval_scores,
    list_samples,
    load_compbench,
    load_metrics,
    mean_ci,
    parse_params,
    parse_run,
)

# ------------------------------------------------------------------------------------------------
# Results helpers
# ------------------------------------------------------------------------------------------------


def test_parse_run_and_params():
    r = parse_run("ablation/toy-nova/toyclip/top_frac~0.3_tau~-0.1_trajectories~4/seed2")
    assert (r.kind, r.policy, r.reward, r.seed, r.variant) == ("ablation", "toy-nova", "toyclip", 2, None)
    assert r.params == {"top_frac": 0.3, "tau": -0.1, "trajectories": 4.0}
    assert parse_run("train/p/r/sim/seed0").variant == "sim"
    assert parse_run("base/p").kind == "base"
    assert parse_params("a~1") == {"a": 1.0}
    with pytest.raises(ValueError, match="unrecognised run id"):
        parse_run("train/p/sim/seed0")


def test_mean_ci_matches_scipy():
    x = [0.31, 0.35, 0.42]
    mean, half, n = mean_ci(x, 0.9)
    lo, hi = stats.t.interval(0.9, df=2, loc=np.mean(x), scale=stats.sem(x))
    assert n == 3 and math.isclose(mean, np.mean(x)) and math.isclose(half, (hi - lo) / 2, rel_tol=1e-12)
    assert mean_ci([0.5, float("nan")]) == (0.5, pytest.approx(math.nan, nan_ok=True), 1)
    assert mean_ci([])[2] == 0


def test_aggregate_seeds_drops_unlogged_steps():
    a = pd.DataFrame({"step": [1, 2, 3], "val_reward": [np.nan, 1.0, np.nan]})
    b = pd.DataFrame({"step": [1, 2, 3], "val_reward": [np.nan, 3.0, 5.0]})
    agg = aggregate_seeds([a, b], "val_reward")
    assert agg["step"].tolist() == [2, 3] and agg["mean"].tolist() == [2.0, 5.0] and agg["n"].tolist() == [2, 1]


def test_loaders(tree):
    root = tree["root"]
    comp = load_compbench(root, f"base/{POLICY}")
    w = np.array([4, 8, 12])
    assert comp["category"].iloc[-1] == "overall"
    assert math.isclose(comp["strict"].iloc[-1], np.dot(w, [0.2, 0.25, 0.3]) / w.sum())  # image-weighted
    metrics = load_metrics(root, f"train/{POLICY}/{REWARD}/mte/seed0")
    assert metrics["clip_frac"].isna().all()  # missing optional column filled
    samples = list_samples(root, f"base/{POLICY}")
    assert set(samples) == set(PROMPTS) and set(samples["a green_striped triangle"]) == {0, 1}
    with pytest.raises(MissingResultError, match=r"eval/base/nope/preference\.csv"):
        eval_scores(root, "base/nope")


def test_overall_row_is_used_when_present(tmp_path):
    write_eval(tmp_path, "base/p", [0.1, 0.2, 0.3], 0.1, overall=True)
    comp = load_compbench(tmp_path, "base/p")
    assert comp["strict"].iloc[-1] == 0.5 and (comp["category"] == "overall").sum() == 1


# ------------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------------


def test_table2_mean_and_ci_against_scipy(tree):
    spec = {"base": tree["base"], "runs": tree["runs"], "variants": VARIANTS}
    t = tables.table2(tree["root"], spec, confidence=0.95)
    df = t.data
    assert df["method"].tolist() == ["Base", "GRPO*", "+Fix*", "+MTE", "+Sim"]
    assert df["selection"].tolist() == ["", "best", "best", "fixed", "fixed"]
    for v, method in zip(VARIANTS, df["method"][1:]):
        row = df[df["method"] == method].iloc[0]
        for c, cat in enumerate(CATEGORIES):
            x = [planted_strict(v, s, c) for s in SEEDS]
            lo, hi = stats.t.interval(0.95, df=len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
            assert math.isclose(row[f"compbench/{cat}/mean"], np.mean(x), rel_tol=1e-12)
            assert math.isclose(row[f"compbench/{cat}/ci"], (hi - lo) / 2, rel_tol=1e-9)
            assert row[f"compbench/{cat}/n"] == 3
    base = df.iloc[0]
    assert base["n_runs"] == 1 and math.isnan(base["pref/toyclip/ci"]) and base["pref/toyclip/mean"] == 0.1
    assert [m for m in t.metrics] == [("pref", "toyclip"), ("pref", "shapes")] + [
        ("compbench", c) for c in CATEGORIES + ["overall"]
    ]


def test_tables_write_three_formats(tree, tmp_path):
    spec2 = {"base": tree["base"], "runs": tree["runs"], "variants": VARIANTS}
    spec1 = {
        "base": tree["base"],
        "runs": [r for r in tree["runs"] if "/grpo/" in r or "/sim/" in r],
        "baseline": "grpo",
        "ours": "sim",
    }
    for name, build, spec in (("table1", tables.table1, spec1), ("table2", tables.table2, spec2)):
        paths = tables.write_table(build(tree["root"], spec, 0.95), tmp_path / name)
        assert [p.suffix for p in paths] == [".csv", ".md", ".tex"] and all(p.stat().st_size > 0 for p in paths)
        df = pd.read_csv(paths[0])
        numeric = df[[c for c in df.columns if c.endswith("/mean")]].to_numpy(dtype=float)
        assert np.isfinite(numeric).all()
        trained = df[df["variant"] != "base"]
        assert np.isfinite(trained[[c for c in df.columns if c.endswith("/ci")]].to_numpy(dtype=float)).all()
        md, tex = paths[1].read_text(), paths[2].read_text()
        assert "**0.7" in md and "±" in md  # +Sim (best) bold; CI present
        assert r"\toprule" in tex and r"\bottomrule" in tex and r"\mathbf{" in tex and r"\pm" in tex
    assert pd.read_csv(tmp_path / "table1.csv")["method"].tolist() == ["Base", "+GRPO*", "Ours"]


OFFSETS = np.array([0.05, -0.02, -0.05, 0.02])  # per-prompt: mean 0 on the even and on the odd prompts


def _with_val_scores(tree, root):
    """A copy of the tree whose summaries hold each validated step's per-prompt scores (the planted reward plus
    OFFSETS) and the base's: the held-out best step is the best one on either half."""
    shutil.copytree(tree["root"], root)
    for run in tree["runs"]:
        val = load_metrics(root, run)[["step", "val_reward"]].dropna()
        ckpts = [
            {"step": int(s), "val_reward": float(v), "val_scores": list(v + OFFSETS), "path": None}
            for s, v in zip(val["step"], val["val_reward"])
        ]
        summary = {"base_val_reward": BASE_VAL, "base_val_scores": list(BASE_VAL + OFFSETS), "checkpoints": ckpts}
        atomic_write_json(root / run / "summary.json", summary)
    return root


def test_val_gain_pairs_each_run_with_its_base(tree, tmp_path):
    root = _with_val_scores(tree, tmp_path / "tree")
    t = tables.val_gain(root, {"runs": tree["runs"], "variants": VARIANTS}, 0.95)
    df = t.data
    assert df["method"].tolist() == ["Base", "GRPO", "+Fix", "+MTE", "+Sim"]
    assert t.metrics == [
        ("val", "base"),
        ("gain", "step 4"),
        ("gain", "step 8"),
        ("gain", "step 12"),
        ("gain", "best"),
        ("gain", "best, held out"),
    ]
    assert df.at[0, "val/base/mean"] == BASE_VAL and math.isnan(df.at[0, "gain/best/mean"])
    for v, method in zip(VARIANTS, df["method"][1:]):
        row = df[df["method"] == method].iloc[0]
        scales = [1.0 + VARIANTS.index(v) + 0.1 * s for s in SEEDS]  # write_metrics: val = 0.3 + 0.01 * step * scale
        for step in (4, 8, 12):
            x = [0.3 + 0.01 * step * sc - BASE_VAL for sc in scales]
            lo, hi = stats.t.interval(0.95, df=2, loc=np.mean(x), scale=stats.sem(x))
            assert math.isclose(row[f"gain/step {step}/mean"], np.mean(x), rel_tol=1e-9)
            assert math.isclose(row[f"gain/step {step}/ci"], (hi - lo) / 2, rel_tol=1e-9)
        assert math.isclose(
            row["gain/best/mean"], np.mean([0.3 + 0.12 * sc - BASE_VAL for sc in scales]), rel_tol=1e-9
        )
        # every step lifts every prompt alike, so both halves choose the best step and the held-out gain is its gain
        assert math.isclose(row["gain/best, held out/mean"], row["gain/best/mean"], rel_tol=1e-9)
    best = tables._best(t)
    assert (0, ("val", "base")) not in best  # the lone base value is not "best" of anything
    assert {i for i, m in best if m[0] == "gain"} == {4}  # +Sim has the largest gains
    paths = tables.write_table(t, tmp_path / "val_gain")
    assert "Gain over the base policy" in paths[2].read_text() and "step 12" in paths[1].read_text()
    assert "best, held out" in paths[1].read_text() and "biased upward" in t.caption


def test_val_gain_without_a_base_reward_names_the_file(tmp_path):
    run = "train/p/r/grpo/seed0"
    write_metrics(tmp_path, run, 1.0)
    atomic_write_json(tmp_path / run / "summary.json", {"checkpoints": []})
    with pytest.raises(ValueError, match="summary.json has no finite base_val_reward"):
        tables.val_gain(tmp_path, {"runs": [run]})


def test_bold_marks_the_best_mean_per_column(tree):
    t = tables.table2(tree["root"], {"base": tree["base"], "runs": tree["runs"], "variants": VARIANTS}, 0.95)
    best = tables._best(t)
    sim_row = t.data.index[t.data["variant"] == "sim"][0]
    assert all((sim_row, m) in best for m in t.metrics)
    assert len(best) == len(t.metrics)


def test_table2_missing_selection_is_named(tree, tmp_path):
    root = tmp_path / "r"
    run = "train/p/r/grpo/seed0"
    write_eval(root, "base/p", [0.1] * 3, 0.1)
    write_eval(root, run, [0.2] * 3, 0.2)
    with pytest.raises(MissingResultError, match=r"select/train/p/r/grpo/seed0/selection\.json"):
        tables.table2(root, {"base": ["base/p"], "runs": [run], "variants": ["grpo"]})


def test_table1_two_policies_one_seed(tmp_path):
    """The default Table 1 shape: two policies, one reward setting, one seed (no CI)."""
    runs = []
    for p, policy in enumerate(["toy-nova", "toy-harmon"]):
        write_eval(tmp_path, f"base/{policy}", [0.1 + p] * 3, 0.1 + p)
        for v, bonus in (("grpo", 0.1), ("sim", 0.2)):
            run = f"train/{policy}/mixed/{v}/seed0"
            runs.append(run)
            write_eval(tmp_path, run, [0.1 + p + bonus] * 3, 0.1 + p + bonus)
    spec = {"base": ["base/toy-harmon", "base/toy-nova"], "runs": runs, "baseline": "grpo", "ours": "sim"}
    t = tables.table1(tmp_path, spec)
    assert t.label_columns == ["policy", "method"]
    assert t.data["method"].tolist() == ["Base", "+GRPO", "Ours"] * 2  # no selection files: no *
    assert t.data["pref/toyclip/ci"].isna().all() and (t.data["n_runs"] == 1).all()
    best = tables._best(t)
    assert {i for i, _ in best} == {2, 5}  # Ours is best within each policy block
    md, tex = tables.to_markdown(t), tables.to_latex(t)
    assert "±" not in md.split("\n", 2)[2] and "| toy-harmon | Ours (1 seed) | **1.300** |" in md
    assert "| toy-harmon | Base |" in md  # the base policy is one policy, not a seed
    assert tex.count(r"\midrule") == 2 and "toy-harmon & Ours & $\\mathbf{1.300}$" in tex

    # a warmed-up base: its warm-up's failed images, strict and seen single objects before and after, in the caption
    quality = {"overall": {"strict": 0.24}, "single_object_color_and_shape": {"seen_pairs": {"accuracy": 0.5}}}
    before = {**quality, "overall": {"strict": 0.17}, "no_valid_object": 0.232}
    (tmp_path / "warm.json").write_text(json.dumps({**quality, "no_valid_object": 0.117, "before_warmup": before}))
    caption = tables.table1(tmp_path, {**spec, "warmups": {"toy-harmon": str(tmp_path / "warm.json")}}).caption
    assert (
        "toy-harmon's Base is its base after the head warm-up (quality suite: 0.232 of images with no valid object, "
        "strict 0.170, seen single objects 0.50 before it, 0.117 of images with no valid object, strict 0.240, seen "
        "single objects 0.50 after)." in caption
    )


def test_table1_refuses_rows_over_unlike_evaluations(tmp_path):
    """Issue #31.2: a run's compbench.csv without one category printed a dash and averaged its overall over the
    others; a missing value, other image counts or other image files are each an error naming the run and file."""
    from margrpo.infra.files import InputError

    runs = []
    for policy in ("toy-nova", "toy-harmon"):
        write_eval(tmp_path, f"base/{policy}", [0.1] * 3, 0.1)
        for v in ("grpo", "sim"):
            runs.append(f"train/{policy}/mixed/{v}/seed0")
            write_eval(tmp_path, runs[-1], [0.2] * 3, 0.2)
    spec = {"base": ["base/toy-nova", "base/toy-harmon"], "runs": runs, "baseline": "grpo", "ours": "sim"}
    tables.table1(tmp_path, spec)
    comp = tmp_path / "eval" / runs[2] / "compbench.csv"
    full = pd.read_csv(comp)

    full.iloc[[0, 2]].to_csv(comp, index=False)  # the "shape" row dropped
    with pytest.raises(InputError, match=rf"{comp}: run {runs[2]} has no 'shape' row, which run base/toy-nova has"):
        tables.table1(tmp_path, spec)
    full.assign(strict=[0.2, None, 0.2]).to_csv(comp, index=False)
    with pytest.raises(InputError, match=rf"{comp}: run {runs[2]}: shape has no finite value"):
        tables.table1(tmp_path, spec)
    full.assign(n_images=[4, 4, 12]).to_csv(comp, index=False)
    with pytest.raises(InputError, match=rf"{comp}: run {runs[2]}: 'shape' averages 4 images, run base/toy-nova 8"):
        tables.table1(tmp_path, spec)
    full.to_csv(comp, index=False)
    for run, files in (
        ("base/toy-nova", ["a_000000.png", "b_000000.png"]),
        (runs[0], ["a_000000.png", "c_000000.png"]),
    ):
        pd.DataFrame({"file": files, "strict": [0.1, 0.2]}).to_csv(
            tmp_path / "eval" / run / "compbench_per_image.csv", index=False
        )
    tables.table1(tmp_path, spec)  # per-image files compared only where every run has one
    for run in [*spec["base"][1:], *runs[1:]]:
        pd.DataFrame({"file": ["a_000000.png", "b_000000.png"], "strict": [0.1, 0.2]}).to_csv(
            tmp_path / "eval" / run / "compbench_per_image.csv", index=False
        )
    with pytest.raises(
        InputError,
        match=(
            rf"compbench_per_image.csv: run {runs[0]} scored other images than run base/toy-nova, "
            r"e.g. 'b_000000.png'"
        ),
    ):
        tables.table1(tmp_path, spec)


# ------------------------------------------------------------------------------------------------
# CLI end to end
# ------------------------------------------------------------------------------------------------


def test_cli_report_table2(tree, tmp_path):
    spec = json.dumps({"base": tree["base"], "runs": tree["runs"], "variants": VARIANTS})
    prefix = tmp_path / "report" / "table2"
    rc = main(
        [
            "report",
            "table2",
            "--runs-json",
            spec,
            "--results",
            str(tree["root"]),
            "--out-prefix",
            str(prefix),
            "--formats",
            "png,pdf",
            "--confidence",
            "0.9",
        ]
    )
    assert rc == 0
    for ext in ("csv", "md", "tex"):
        assert (tmp_path / "report" / f"table2.{ext}").stat().st_size > 0
    df = pd.read_csv(f"{prefix}.csv")
    x = [planted_strict("sim", s, 0) for s in SEEDS]
    lo, hi = stats.t.interval(0.9, df=2, loc=np.mean(x), scale=stats.sem(x))
    assert math.isclose(df.loc[df["variant"] == "sim", "compbench/color/ci"].item(), (hi - lo) / 2, rel_tol=1e-9)
