"""Tables and figures from a synthetic results tree (no training: every number is planted here)."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy import stats

from margrpo.cli import main
from margrpo.infra.files import atomic_write_json
from margrpo.reporting import figures, tables
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

POLICY, REWARD = "toy-nova", "toyclip"
VARIANTS = ["grpo", "fix", "mte", "sim"]
SEEDS = [0, 1, 2]
CATEGORIES = ["color", "shape", "2d-spatial"]
PROMPTS = ["a red circle", "two blue squares", "a green_striped triangle"]  # `_` inside a prompt
BASE_VAL = 0.33
ABLATION_POINTS = [(0.0, 0.0, 4), (0.3, 0.0, 4), (0.5, 0.0, 4), (0.3, 0.1, 4), (0.3, 0.0, 2)]


def _strict(variant: str, seed: int, cat: int) -> float:
    """A planted CompBench score: distinct per variant, seed and category."""
    return 0.3 + 0.1 * (VARIANTS.index(variant) + 1 if variant in VARIANTS else 0) + 0.01 * seed**2 + 0.02 * cat


def _write_eval(root, run, strict, pref, overall=False):
    folder = root / "eval" / run
    folder.mkdir(parents=True)
    rows = [
        {"category": c, "n_images": 4 * (i + 1), "strict": s, "lenient": s + 0.1}
        for i, (c, s) in enumerate(zip(CATEGORIES, strict))
    ]
    if overall:
        rows.append({"category": "overall", "n_images": 24, "strict": 0.5, "lenient": 0.6})
    pd.DataFrame(rows).to_csv(folder / "compbench.csv", index=False)
    pd.DataFrame(
        [
            {"scorer": "toyclip", "mean": pref, "std": 0.1, "n": 12},
            {"scorer": "shapes", "mean": pref / 2, "std": 0.1, "n": 12},
        ]
    ).to_csv(folder / "preference.csv", index=False)


def _write_samples(root, run, shade):
    folder = root / "samples" / run / "samples"
    folder.mkdir(parents=True)
    for p, prompt in enumerate(PROMPTS):
        for index in (0, 1):
            img = np.full((32, 32, 3), (shade * 37 + p * 60 + index) % 256, dtype=np.uint8)
            img[8:24, 8:24, p % 3] = 255
            Image.fromarray(img).save(folder / f"{prompt}_{index:06d}.png")


def _write_metrics(root, run, scale, steps=12, drop=()):
    rng = np.random.default_rng(int(scale * 1000))
    step = np.arange(1, steps + 1)
    df = pd.DataFrame(
        {
            "step": step,
            "reward_mean": 0.3 + 0.02 * step * scale + 0.01 * rng.standard_normal(steps),
            "reward_std": 0.1,
            "adv_mean": 0.0,
            "adv_std": 1.0,
            "frac_zero_std": 0.0,
            "policy_loss": 0.01,
            "kl": 1e-3 * step,
            "clip_frac": 0.05,
            "ratio_min": 0.9,
            "ratio_max": 1.1,
            "grad_norm_ar": scale * (1 + rng.random(steps)),
            "grad_var_ar": scale * 1e-3 * (1 + rng.random(steps)),
            "lr": 1e-4,
            "wall_time_s": step * 2.0,
            "peak_mem_mb": 100.0,
            "skipped": 0,
            "val_reward": np.where(step % 4 == 0, 0.3 + 0.01 * step * scale, np.nan),
            "reward/toyclip": 0.3,
        }
    ).drop(columns=list(drop))
    (root / run).mkdir(parents=True, exist_ok=True)
    df.to_csv(root / run / "metrics.csv", index=False)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    _write_eval(root, f"base/{POLICY}", [0.2, 0.25, 0.3], 0.1)
    _write_samples(root, f"base/{POLICY}", 0)
    runs = []
    for v in VARIANTS:
        for s in SEEDS:
            run = f"train/{POLICY}/{REWARD}/{v}/seed{s}"
            runs.append(run)
            _write_eval(root, run, [_strict(v, s, c) for c in range(3)], 0.2 + 0.1 * VARIANTS.index(v) + 0.01 * s)
            _write_metrics(root, run, 1.0 + VARIANTS.index(v) + 0.1 * s, drop=("clip_frac",) if v == "mte" else ())
            atomic_write_json(root / run / "summary.json", {"base_val_reward": BASE_VAL, "checkpoints": []})
            rule, step = ("best", 8) if v in ("grpo", "fix") else ("fixed", 12)
            atomic_write_json(
                root / "select" / run / "selection.json",
                {"policy": f"{run}/ckpt/policy", "step": step, "rule": rule, "val_reward": 0.4, "candidates": []},
            )
            if s == 0:
                _write_samples(root, run, VARIANTS.index(v) + 1)
    ablation = []
    for k, tau, S in ABLATION_POINTS:
        for s in (0, 1):
            run = f"ablation/{POLICY}/{REWARD}/top_frac~{k}_tau~{tau}_trajectories~{S}/seed{s}"
            ablation.append(run)
            _write_eval(root, run, [0.4 + k / 4 - tau + S / 100 + 0.01 * s] * 3, 0.3 + k / 10 + 0.005 * s)
            _write_metrics(root, run, 1.0 + k + 0.1 * s, steps=30)
            _write_samples(root, run, int(10 * k) + S)
    (root / "uncertainty").mkdir()
    rng = np.random.default_rng(0)
    np.savez(
        root / "uncertainty" / "maps.npz",
        images=rng.integers(0, 255, (2, 32, 32, 3), dtype=np.uint8),
        uncertainty=rng.random((2, 8, 8), dtype=np.float32),
        prompts=np.array(PROMPTS[:2]),
        trajectories=rng.integers(0, 255, (2, 3, 32, 32, 3), dtype=np.uint8),
    )
    return {"root": root, "runs": runs, "ablation": ablation, "base": [f"base/{POLICY}"]}


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
    _write_eval(tmp_path, "base/p", [0.1, 0.2, 0.3], 0.1, overall=True)
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
            x = [_strict(v, s, c) for s in SEEDS]
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


def test_val_gain_pairs_each_run_with_its_base(tree, tmp_path):
    t = tables.val_gain(tree["root"], {"runs": tree["runs"], "variants": VARIANTS}, 0.95)
    df = t.data
    assert df["method"].tolist() == ["Base", "GRPO", "+Fix", "+MTE", "+Sim"]
    assert t.metrics == [
        ("val", "base"),
        ("gain", "step 4"),
        ("gain", "step 8"),
        ("gain", "step 12"),
        ("gain", "best"),
    ]
    assert df.at[0, "val/base/mean"] == BASE_VAL and math.isnan(df.at[0, "gain/best/mean"])
    for v, method in zip(VARIANTS, df["method"][1:]):
        row = df[df["method"] == method].iloc[0]
        scales = [1.0 + VARIANTS.index(v) + 0.1 * s for s in SEEDS]  # _write_metrics: val = 0.3 + 0.01 * step * scale
        for step in (4, 8, 12):
            x = [0.3 + 0.01 * step * sc - BASE_VAL for sc in scales]
            lo, hi = stats.t.interval(0.95, df=2, loc=np.mean(x), scale=stats.sem(x))
            assert math.isclose(row[f"gain/step {step}/mean"], np.mean(x), rel_tol=1e-9)
            assert math.isclose(row[f"gain/step {step}/ci"], (hi - lo) / 2, rel_tol=1e-9)
        assert math.isclose(
            row["gain/best/mean"], np.mean([0.3 + 0.12 * sc - BASE_VAL for sc in scales]), rel_tol=1e-9
        )
    best = tables._best(t)
    assert (0, ("val", "base")) not in best  # the lone base value is not "best" of anything
    assert {i for i, m in best if m[0] == "gain"} == {4}  # +Sim has the largest gains
    paths = tables.write_table(t, tmp_path / "val_gain")
    assert "Gain over the base policy" in paths[2].read_text() and "step 12" in paths[1].read_text()


def test_val_gain_without_a_base_reward_names_the_file(tmp_path):
    run = "train/p/r/grpo/seed0"
    _write_metrics(tmp_path, run, 1.0)
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
    _write_eval(root, "base/p", [0.1] * 3, 0.1)
    _write_eval(root, run, [0.2] * 3, 0.2)
    with pytest.raises(MissingResultError, match=r"select/train/p/r/grpo/seed0/selection\.json"):
        tables.table2(root, {"base": ["base/p"], "runs": [run], "variants": ["grpo"]})


# ------------------------------------------------------------------------------------------------
# Figures (each kind writes non-empty PNG and PDF)
# ------------------------------------------------------------------------------------------------


def _check_figure(fig, tmp_path, name):
    from margrpo.infra.files import atomic_save_figure

    paths = atomic_save_figure(fig, tmp_path / name, ["png", "pdf"], dpi=60)
    assert [p.name for p in paths] == [f"{name}.png", f"{name}.pdf"]
    assert all(p.stat().st_size > 1000 for p in paths)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(f".{name}")) == []  # no temp files


@pytest.mark.parametrize("what", ["dynamics", "samples"])
def test_ladder_figures(tree, tmp_path, what):
    spec = {"base": tree["base"], "runs": tree["runs"], "prompts": 2}
    fig = getattr(figures, what)(tree["root"], spec, confidence=0.95)
    if what == "dynamics":
        assert {t.get_text() for t in fig.axes[-1].get_legend().get_texts()} == {"GRPO*", "+Fix*", "+MTE", "+Sim"}
        assert fig.axes[1].get_yscale() == "log"
    else:
        assert len(fig.axes) == 2 * 5  # 2 prompts x (Base + 4 variants)
        assert fig.axes[0].get_title() == "Base" and fig.axes[1].get_title() == "GRPO*"
    _check_figure(fig, tmp_path, what)


def test_dynamics_with_several_policies_or_rewards_gets_one_row_each(tmp_path):
    frames = [
        pd.DataFrame(
            {
                "step": [1, 2, 3],
                "grad_norm_ar": [0.2, 0.1 * s, 0.3],
                "grad_var_ar": [1e-7] * 3,
                "val_reward": [0.5, float("nan"), 0.6],
                "reward_mean": [0.4, 0.5, 0.6],
                "kl": [0.0, 1e-4, 2e-4],
            }
        )
        for s in range(3)
    ]
    blocks = [
        (
            f"{p}, mixed reward",
            [("GRPO*", figures.variant_color("grpo"), frames), ("+Sim", figures.variant_color("sim"), frames)],
        )
        for p in ("toy-nova", "toy-harmon")
    ]
    fig = figures.plot_dynamics(blocks, 0.95)
    assert len(fig.axes) == 2 * len(figures.DYNAMICS_PANELS)
    assert fig.axes[5].get_title() == "AR gradient norm\ntoy-harmon, mixed reward"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["GRPO*", "+Sim"]
    band = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]
    assert band.min() >= 0  # a norm's CI band stops at 0
    _check_figure(fig, tmp_path, "dynamics_blocks")


@pytest.mark.parametrize("what", ["ablation_samples", "ablation_curves", "ablation_final"])
def test_ablation_figures(tree, tmp_path, what):
    fig = getattr(figures, what)(tree["root"], {"runs": tree["ablation"], "prompts": 2}, confidence=0.95)
    if what == "ablation_curves":  # tau = 0 and S = 4 held: k in {0, 0.3, 0.5}
        assert len(fig.axes[0].get_lines()) == 3
        assert all(float(t).is_integer() for t in fig.axes[0].get_xticks())  # steps: integer ticks
    _check_figure(fig, tmp_path, what)


def test_fig7c_draws_only_the_parameters_the_grid_varies(tree, tmp_path):
    """A grid that varies k alone (the default run's) gets one panel, not three with one point in two."""
    k_only = [r for r in tree["ablation"] if "tau~0.0_" in r and "trajectories~4/" in r]
    assert len({r.split("top_frac~")[1].split("_")[0] for r in k_only}) > 1
    fig = figures.ablation_final(tree["root"], {"runs": k_only}, confidence=0.95)
    panels = [ax for ax in fig.axes if ax.get_xlabel()]
    assert [ax.get_xlabel() for ax in panels] == ["k: fraction of most uncertain tokens (MTE)"] * 3  # one per metric
    full = figures.ablation_final(tree["root"], {"runs": tree["ablation"]}, confidence=0.95)
    assert len({ax.get_xlabel() for ax in full.axes}) == 3 and len(full.axes) == 3 * 3
    _check_figure(fig, tmp_path, "fig7c_k_only")


def test_fig7c_one_panel_per_metric_without_a_second_y_axis(tree, tmp_path):
    """Two metrics on twin y axes read against each other's scale; each metric gets its own panel."""
    fig = figures.ablation_final(tree["root"], {"runs": tree["ablation"], "base": tree["base"][0]}, confidence=0.95)
    for ax in fig.axes:
        assert ax.get_shared_x_axes().get_siblings(ax) == [ax]  # no twinx
        assert ax.get_shared_y_axes().get_siblings(ax) == [ax]
    titles = ["CompBench overall (strict)", "toyclip (preference)", "shapes (preference)"]
    assert [ax.get_title() for ax in fig.axes] == titles * 3  # rows k, tau, S; one Axes per metric in each
    base = figures.eval_scores(tree["root"], tree["base"][0])
    k_row = fig.axes[:3]
    for ax, key in zip(k_row, [("compbench", "overall"), ("pref", "toyclip"), ("pref", "shapes")]):
        dotted = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
        assert len(dotted) == 1 and dotted[0].get_ydata()[0] == pytest.approx(base[key])
        # k in {0, 0.3, 0.5} with tau = 0, S = 4: two seeds each, so a t-interval bar at every point
        (bars,) = [c for c in ax.containers if c.has_yerr]
        segments = bars.lines[2][0].get_segments()
        assert len(segments) == 3
        x = [0.3 + 0.3 / 10, 0.3 + 0.3 / 10 + 0.005] if key == ("pref", "toyclip") else None
        if x is not None:  # the k = 0.3 point: mean +- t-interval of its two seeds
            lo, hi = stats.t.interval(0.95, df=1, loc=np.mean(x), scale=stats.sem(x))
            assert sorted(segments[1][:, 1]) == pytest.approx([lo, hi])
        assert sorted(t.get_text() for t in ax.texts) == ["n=2"] * 3
    _check_figure(fig, tmp_path, "fig7c_panels")


def test_fig7c_one_seed_draws_points_alone(tree, tmp_path):
    one_seed = [r for r in tree["ablation"] if r.endswith("seed0")]
    fig = figures.ablation_final(tree["root"], {"runs": one_seed}, confidence=0.95)
    assert all(not ax.containers for ax in fig.axes)  # no error bar (not even a zero-length one)
    assert all(t.get_text() == "n=1" for ax in fig.axes for t in ax.texts)
    assert "one seed per point" in fig.get_suptitle()


def test_fig7c_draws_the_base_inside_its_axis_and_each_points_seed_count(tree, tmp_path):
    """Issue #26.7: one seed per point on a narrow axis reads as a trend; the base line and n= say what it is."""
    fig = figures.ablation_final(tree["root"], {"runs": tree["ablation"], "base": tree["base"][0]}, confidence=0.95)
    ax = [a for a in fig.axes if a.get_xlabel()][0]
    base = load_compbench(tree["root"], tree["base"][0]).set_index("category").loc["overall", "strict"]
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() == ":"]
    assert len(lines) == 1 and lines[0].get_ydata()[0] == pytest.approx(base)
    lo, hi = ax.get_ylim()
    assert lo < base < hi
    assert any(t.get_text().startswith("n=") for t in ax.texts)
    _check_figure(fig, tmp_path, "fig7c_base")


def test_fig2_kl_panel_is_on_a_log_axis(tmp_path):
    """The frozen-head variants' KL is orders of magnitude below end-to-end GRPO's: a linear axis shows it as 0."""
    frames = [
        pd.DataFrame(
            {
                "step": [1, 2, 3],
                "grad_norm_ar": [0.2, 0.1, 0.3],
                "grad_var_ar": [1e-7] * 3,
                "val_reward": [0.5, 0.55, 0.6],
                "reward_mean": [0.4, 0.5, 0.6],
                "kl": [1e-6, 1e-5, 2e-5],
            }
        )
    ]
    big = [f.assign(kl=f["kl"] * 1e4) for f in frames]
    fig = figures.plot_dynamics([("toy", [("GRPO*", "#D55E00", big), ("+Fix*", "#0072B2", frames)])], 0.95)
    kl_ax = next(ax for ax in fig.axes if ax.get_title() == "KL term to the reference")
    assert kl_ax.get_yscale() == "log" and len(kl_ax.get_lines()) == 2
    _check_figure(fig, tmp_path, "dynamics_kl_log")


LADDER = ["grpo", "fix", "mte", "sim", "committed", "head"]  # the config's default variants


def _ladder_tree(root, variants, frozen_ar=("head",)):
    """metrics.csv and summary.json (its config: freeze_ar as the trainer ran) for one seed of each variant."""
    runs = []
    for i, v in enumerate(variants):
        run = f"train/{POLICY}/{REWARD}/{v}/seed0"
        _write_metrics(root, run, 1.0 + i)
        atomic_write_json(root / run / "summary.json", {"checkpoints": [], "config": {"freeze_ar": v in frozen_ar}})
        runs.append(run)
    return runs


def _line_colors(ax) -> dict[str, str]:
    from matplotlib.colors import to_hex

    return {ln.get_label(): to_hex(ln.get_color()) for ln in ax.get_lines()}


@pytest.mark.parametrize("extra", [[], ["wide"], [f"v{i}" for i in range(25)]])
def test_fig2_gives_each_variant_its_own_colour(tmp_path, extra):
    """Committed and head were both yellow. The ladder's colours stay fixed; others never repeat one."""
    variants = LADDER + extra
    fig = figures.dynamics(tmp_path, {"runs": _ladder_tree(tmp_path, variants)}, confidence=0.95)
    val = next(ax for ax in fig.axes if ax.get_title() == "Validation reward")
    colors = _line_colors(val)
    assert len(colors) == len(variants) and len(set(colors.values())) == len(variants)
    for v in ("grpo", "fix", "mte", "sim", "committed", "head"):
        assert colors[tables.VARIANT_LABELS[v]] == figures.VARIANT_COLORS[v].lower()
    assert figures.VARIANT_COLORS["base"] not in colors.values()
    _check_figure(fig, tmp_path, "dynamics_colours")


def test_fig2_draws_the_head_gradient_of_an_ar_frozen_run_on_its_own_panels(tmp_path):
    """Under freeze_ar the logged grad_*_ar are the head's (GRPOTrainer.stat_params): not the AR's.
    The run's config says so (freeze_ar), whatever the variant is called."""
    runs = _ladder_tree(tmp_path, LADDER + ["headonly2"], frozen_ar=("head", "headonly2"))
    fig = figures.dynamics(tmp_path, {"runs": runs}, confidence=0.95)
    by_title = {ax.get_title(): ax for ax in fig.axes}
    frozen = {"Head only", "headonly2"}
    for title in ("AR gradient norm", "AR gradient variance"):
        assert set(_line_colors(by_title[title])) == {"GRPO", "+Fix", "+MTE", "+Sim", "+Fix (committed)"}
    for title in ("Head gradient norm (AR frozen)", "Head gradient variance (AR frozen)"):
        assert set(_line_colors(by_title[title])) == frozen
    head = pd.read_csv(tmp_path / runs[LADDER.index("head")] / "metrics.csv")
    line = next(ln for ln in by_title["Head gradient norm (AR frozen)"].get_lines() if ln.get_label() == "Head only")
    assert np.allclose(line.get_ydata(), head["grad_norm_ar"])
    assert set(_line_colors(by_title["Validation reward"])) >= frozen  # every other panel: all variants
    title = fig.axes[-1].get_legend().get_title().get_text()
    assert "Head only, headonly2: AR frozen" in title
    _check_figure(fig, tmp_path, "dynamics_head")
    # without a frozen-AR run: the five panels of Fig. 2 and no head panel
    plain = figures.dynamics(tmp_path, {"runs": runs[:4]}, confidence=0.95)
    assert [ax.get_title() for ax in plain.axes[:5]] == [p[1] for p in figures.DYNAMICS_PANELS]
    assert len(plain.axes) == 6


def test_fig2_rows_of_blocks_keep_the_head_panels(tmp_path):
    frames = [
        pd.DataFrame(
            {
                "step": [1, 2, 3],
                "grad_norm_ar": [0.2, 0.1, 0.3],
                "grad_var_ar": [1e-7] * 3,
                "val_reward": [0.5, 0.55, 0.6],
                "reward_mean": [0.4, 0.5, 0.6],
                "kl": [1e-6, 1e-5, 2e-5],
            }
        )
    ]
    blocks = [
        ("nova", [("GRPO", "#D55E00", frames), figures.Series("Head only", "#E69F00", frames, True)]),
        ("harmon", [("GRPO", "#D55E00", frames)]),
    ]
    fig = figures.plot_dynamics(blocks, 0.95)
    assert len(fig.axes) == 2 * 7
    assert fig.axes[2].get_title() == "Head gradient norm (AR frozen)\nnova" and len(fig.axes[2].get_lines()) == 1
    assert [t.get_text() for t in fig.axes[9].texts] == ["no run with\nthe AR frozen"]
    assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["GRPO"]


def test_uncertainty_figure(tree, tmp_path):
    fig = figures.uncertainty(tree["root"], {"maps": str(tree["root"] / "uncertainty" / "maps.npz")})
    _check_figure(fig, tmp_path, "uncertainty")
    with pytest.raises(MissingResultError, match="nope.npz"):
        figures.uncertainty(tree["root"], {"maps": str(tmp_path / "nope.npz")})


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
    x = [_strict("sim", s, 0) for s in SEEDS]
    lo, hi = stats.t.interval(0.9, df=2, loc=np.mean(x), scale=stats.sem(x))
    assert math.isclose(df.loc[df["variant"] == "sim", "compbench/color/ci"].item(), (hi - lo) / 2, rel_tol=1e-9)


def test_cli_report_figure(tree, tmp_path):
    prefix = tmp_path / "fig7c"
    main(
        [
            "report",
            "ablation-final",
            "--runs-json",
            json.dumps({"runs": tree["ablation"]}),
            "--results",
            str(tree["root"]),
            "--out-prefix",
            str(prefix),
            "--formats",
            "png",
        ]
    )
    assert (tmp_path / "fig7c.png").stat().st_size > 0 and not (tmp_path / "fig7c.pdf").exists()


def test_table1_two_policies_one_seed(tmp_path):
    """The default Table 1 shape: two policies, one reward setting, one seed (no CI)."""
    runs = []
    for p, policy in enumerate(["toy-nova", "toy-harmon"]):
        _write_eval(tmp_path, f"base/{policy}", [0.1 + p] * 3, 0.1 + p)
        for v, bonus in (("grpo", 0.1), ("sim", 0.2)):
            run = f"train/{policy}/mixed/{v}/seed0"
            runs.append(run)
            _write_eval(tmp_path, run, [0.1 + p + bonus] * 3, 0.1 + p + bonus)
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


def test_table1_refuses_rows_over_unlike_evaluations(tmp_path):
    """Issue #31.2: a run's compbench.csv without one category printed a dash and averaged its overall over the
    others; a missing value, other image counts or other image files are each an error naming the run and file."""
    from margrpo.infra.files import InputError

    runs = []
    for policy in ("toy-nova", "toy-harmon"):
        _write_eval(tmp_path, f"base/{policy}", [0.1] * 3, 0.1)
        for v in ("grpo", "sim"):
            runs.append(f"train/{policy}/mixed/{v}/seed0")
            _write_eval(tmp_path, runs[-1], [0.2] * 3, 0.2)
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
