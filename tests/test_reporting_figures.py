"""Figures from a synthetic results tree (tests/results_tree.py; no training: every number is planted there): each
kind writes non-empty PNG and PDF; the dynamics, ablation and uncertainty figures draw what they should; the CLI's
`report ablation-final`. The tables: test_reporting_tables.py."""

import json

import numpy as np
import pandas as pd
import pytest
from results_tree import POLICY, REWARD, write_metrics
from scipy import stats

from margrpo.cli import main
from margrpo.infra.files import atomic_write_json
from margrpo.reporting import figures, tables
from margrpo.reporting.results import MissingResultError, load_compbench


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
        write_metrics(root, run, 1.0 + i)
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
