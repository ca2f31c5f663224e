"""Table 3 and the wall-clock figure (issue #19) from a synthetic result tree with planted gains.

Two methods share the discrete base `toy-mask` over three seeds: "MaskGRPO" gains +0.05 validation
reward and +0.25 CompBench-style accuracy, "GRPO (discrete)" gains nothing; "MARVAL-RL" (one seed,
base `toy-marval`) reports a fixed step that is not its best. Every file is written in the format of
the stage that writes it: summary.json (`run_files.write_outputs`), metrics.csv, selection.json
(`select_checkpoint` itself) and the two CompBench CSVs (`toy_compbench.evaluate_samples`).
"""

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from margrpo.cli import main
from margrpo.evaluation.toy_compbench import PER_IMAGE_COLUMNS
from margrpo.infra.files import atomic_write_json
from margrpo.reporting import related, tables
from margrpo.reporting.results import MissingResultError
from margrpo.reporting.selection import select_checkpoint

SEEDS = [0, 1, 2]
SEED_OFFSET = {0: -0.01, 1: 0.0, 2: 0.01}  # per-seed shift of the validation gain: mean 0 over seeds
VAL_STEPS = (4, 8, 12)
N_VAL = 16
EVAL_FILES = [f"prompt {p}_{i:06d}.png" for p in range(6) for i in range(2)]  # 12 images
BASE_STRICT = np.array([1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0], dtype=float)  # 4 of 12 correct
WARMUP_S = 30.0  # the first step's time: an outlier the median ignores


def _step_times(median: float) -> list[float]:
    """12 step times with the given median (the 6th and 7th sorted values): a slow first step, then
    five below the median, two at it and four above; their mean is well above the median."""
    return [WARMUP_S] + [median - 0.2] * 5 + [median] * 2 + [median + 0.2] * 4


def _val_gains(gain: float) -> dict[int, float]:
    """The validation gain of each validated step (before the seed's offset): best at step 8."""
    return {4: gain / 2 - 0.02, 8: gain, 12: 0.8 * gain - 0.01}


def _write_eval(root, run, strict):
    folder = root / "eval" / run
    folder.mkdir(parents=True)
    per_image = pd.DataFrame(
        [
            {
                "file": f,
                "prompt": f.rsplit("_", 1)[0],
                "index": int(f[-10:-4]),
                "category": "color" if k < 6 else "shape",
                "unseen": False,
                "strict": s,
                "lenient": s,
            }
            for k, (f, s) in enumerate(zip(EVAL_FILES, strict))
        ],
        columns=PER_IMAGE_COLUMNS,
    )
    per_image.to_csv(folder / "compbench_per_image.csv", index=False)
    per_category = (
        per_image.groupby("category", sort=False)
        .agg(n_images=("file", "size"), strict=("strict", "mean"), lenient=("lenient", "mean"))
        .reset_index()
    )
    per_category.to_csv(folder / "compbench.csv", index=False)


def _write_run(root, run, base_scores, gain, offset, flips, step_s, report_step="best"):
    """A run whose validation gain at step t is _val_gains(gain)[t] + offset (per prompt: plus zero-mean
    noise) and whose evaluation flips the base's per-image strict score at the images in `flips`."""
    rng = np.random.default_rng(sum(map(ord, run)))
    ckpts = []
    for step, g in _val_gains(gain).items():
        noise = rng.normal(0, 0.01, N_VAL)
        scores = base_scores + g + offset + (noise - noise.mean())
        ckpts.append(
            {
                "step": step,
                "val_reward": float(scores.mean()),
                "val_scores": scores.tolist(),
                "path": f"{root / run}/state/ckpt-{step:06d}/policy",
            }
        )
    summary = {
        "run_dir": str(root / run),
        "variant": run.split("/")[3],
        "steps": 12,
        "checkpoints": ckpts,
        "base_val_reward": float(base_scores.mean()),
        "base_val_scores": base_scores.tolist(),
        "spec": {},
        "config": {},
    }
    atomic_write_json(root / run / "summary.json", summary, indent=1)
    val = {c["step"]: c["val_reward"] for c in ckpts}
    steps = np.arange(1, 13)
    pd.DataFrame(
        {
            "step": steps,
            "reward_mean": 0.4,
            "reward_std": 0.1,
            "kl": 1e-3,
            "lr": 1e-4,
            "step_time_s": step_s,
            "peak_mem_mb": 100.0,
            "val_reward": [val.get(int(s), math.nan) for s in steps],
        }
    ).to_csv(root / run / "metrics.csv", index=False)
    atomic_write_json(root / "select" / run / "selection.json", select_checkpoint(summary, report_step))
    strict = BASE_STRICT.copy()
    strict[list(flips)] = 1 - strict[list(flips)]
    _write_eval(root, run, strict)


# method label -> (policy, variant, validation gain, per-seed flipped images, median step time per seed)
PLANTED = {
    "MaskGRPO": ("toy-mask", "maskgrpo", 0.05, {0: [1, 2], 1: [1, 2, 4], 2: [1, 2, 4, 5]}, {0: 2.0, 1: 2.5, 2: 3.0}),
    "GRPO (discrete)": ("toy-mask", "grpo", 0.0, {0: [0, 1], 1: [1], 2: [0]}, {0: 1.0, 1: 1.2, 2: 1.7}),
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    base_scores = np.random.default_rng(0).uniform(0.3, 0.7, N_VAL)
    _write_eval(root, "base/toy-mask", BASE_STRICT)
    _write_eval(root, "base/toy-marval", BASE_STRICT)
    methods = []
    for label, (policy, variant, gain, flips, medians) in PLANTED.items():
        runs = [f"train/{policy}/mixed/{variant}/seed{s}" for s in SEEDS]
        for s, run in zip(SEEDS, runs):
            _write_run(root, run, base_scores, gain, SEED_OFFSET[s], flips[s], _step_times(medians[s]))
        methods.append({"label": label, "base": f"base/{policy}", "runs": runs})
    marval = "train/toy-marval/mixed/marval-rl/seed0"
    _write_run(root, marval, base_scores, 0.05, 0.0, [1, 2, 4], _step_times(0.2), report_step=12)
    methods.append({"label": "MARVAL-RL", "base": "base/toy-marval", "runs": [marval]})
    return {"root": root, "spec": {"methods": methods}, "base_val": float(base_scores.mean())}


def _row(table, label):
    return table.data[table.data["method"] == label].iloc[0]


def _t_interval(x):
    return stats.ttest_1samp(x, 0).confidence_interval(0.95)


def test_table3_gains_and_their_intervals(tree):
    t = related.table3(tree["root"], tree["spec"], confidence=0.95)
    assert t.data["method"].tolist() == ["MaskGRPO", "GRPO (discrete)", "MARVAL-RL"]
    gained, flat = _row(t, "MaskGRPO"), _row(t, "GRPO (discrete)")
    # validation reward at the selected (best) step 8, paired per prompt: gain + the seed's offset
    x = [0.05 + SEED_OFFSET[s] for s in SEEDS]
    ci = _t_interval(x)
    assert gained["gain/val gain/mean"] == pytest.approx(0.05, abs=1e-12)
    assert gained["gain/val gain/ci"] == pytest.approx((ci.high - ci.low) / 2, rel=1e-9)
    assert gained["gain/val gain/mean"] - gained["gain/val gain/ci"] > 0  # the interval excludes 0
    assert gained["gain/val gain/boot_lo"] > 0
    assert flat["gain/val gain/mean"] == pytest.approx(0.0, abs=1e-12)
    assert (
        flat["gain/val gain/mean"] - flat["gain/val gain/ci"]
        < 0
        < flat["gain/val gain/mean"] + flat["gain/val gain/ci"]
    )
    assert flat["gain/val gain/boot_lo"] < 0 < flat["gain/val gain/boot_hi"]
    # CompBench-style gain, paired per image: flipped 0 -> 1 count minus 1 -> 0 count, over 12 images
    for row, (*_, flips, _) in ((gained, PLANTED["MaskGRPO"]), (flat, PLANTED["GRPO (discrete)"])):
        per_seed = [sum(1 - 2 * BASE_STRICT[i] for i in flips[s]) / 12 for s in SEEDS]
        ci = _t_interval(per_seed)
        assert row["gain/CompBench gain/mean"] == pytest.approx(np.mean(per_seed), abs=1e-12)
        assert row["gain/CompBench gain/ci"] == pytest.approx((ci.high - ci.low) / 2, rel=1e-9)
        assert row["gain/CompBench gain/n"] == 3 and row["seeds"] == 3
    assert (
        gained["gain/CompBench gain/mean"] == pytest.approx(0.25)
        and gained["gain/CompBench gain/mean"] - gained["gain/CompBench gain/ci"] > 0
    )
    assert flat["gain/CompBench gain/mean"] == pytest.approx(0.0, abs=1e-12)
    # base columns: the base's validation reward and its CompBench overall (4 of 12 images)
    assert gained["base/val reward/mean"] == pytest.approx(tree["base_val"]) and gained[
        "base/CompBench/mean"
    ] == pytest.approx(4 / 12)
    assert gained["steps"] == "8;8;8"


def test_table3_step_time_is_the_median_per_seed(tree):
    t = related.table3(tree["root"], tree["spec"])
    for label, (*_, medians) in PLANTED.items():
        row = _row(t, label)
        per_seed = [medians[s] for s in SEEDS]
        assert [float(np.median(_step_times(m))) for m in per_seed] == per_seed  # the warm-up step is ignored
        assert row["time/s per step/mean"] == pytest.approx(np.mean(per_seed), rel=1e-12)
        assert row["time/s per step/ci"] == pytest.approx(
            (lambda c: (c.high - c.low) / 2)(_t_interval(per_seed)), rel=1e-9
        )
        assert (row["time/s per step/min"], row["time/s per step/max"]) == (min(per_seed), max(per_seed))


def test_table3_reports_the_selected_step_not_the_best(tree):
    """MARVAL-RL's selection fixes step 12 (gain 0.8 * 0.05 - 0.01 = 0.03), below its best (0.05 at step 8)."""
    row = _row(related.table3(tree["root"], tree["spec"]), "MARVAL-RL")
    assert row["steps"] == "12" and row["seeds"] == 1
    assert row["gain/val gain/mean"] == pytest.approx(0.03, abs=1e-12) and math.isnan(row["gain/val gain/ci"])


def test_table3_bold_only_within_a_base_and_fastest_step(tree):
    t = related.table3(tree["root"], tree["spec"])
    best = tables._best(t)
    assert best == {(0, ("gain", "val gain")), (0, ("gain", "CompBench gain")), (1, ("time", "s per step"))}
    assert [len(b) for b in tables._blocks(t)] == [2, 1]  # toy-mask, toy-marval
    assert "Fewer than 3 seeds" in t.caption and "MARVAL-RL" in t.caption


def test_cli_writes_table3_and_the_figure(tree, tmp_path):
    spec = json.dumps(tree["spec"])
    for what, prefix in (("table3", tmp_path / "table3"), ("related-wallclock", tmp_path / "related_wallclock")):
        rc = main(
            [
                "report",
                what,
                "--runs-json",
                spec,
                "--results",
                str(tree["root"]),
                "--out-prefix",
                str(prefix),
                "--formats",
                "png",
                "--confidence",
                "0.95",
            ]
        )
        assert rc == 0
    for ext in ("csv", "md", "tex"):
        assert (tmp_path / f"table3.{ext}").stat().st_size > 0
    df = pd.read_csv(tmp_path / "table3.csv")
    assert {"gain/val gain/mean", "gain/val gain/ci", "gain/val gain/n", "time/s per step/mean"} <= set(df.columns)
    md, tex = (tmp_path / "table3.md").read_text(), (tmp_path / "table3.tex").read_text()
    assert "| MaskGRPO | 3 |" in md and "| MARVAL-RL | 1 |" in md
    assert "**0.050** ± " in md and r"\midrule" in tex and "Wall-clock" in tex and "nan" not in md.lower()
    assert (tmp_path / "related_wallclock.png").stat().st_size > 1000


def test_wallclock_figure_plots_the_mean_seconds_at_validated_steps(tree):
    fig = related.related_wallclock(tree["root"], tree["spec"])
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["MaskGRPO (n=3)", "GRPO (discrete) (n=3)", "MARVAL-RL (n=1)", "base policy (each method's own)"]
    line = ax.get_lines()[0]
    medians = PLANTED["MaskGRPO"][-1]
    expected_x = [np.mean([np.cumsum(_step_times(medians[s]))[step - 1] for s in SEEDS]) for step in VAL_STEPS]
    assert line.get_xdata() == pytest.approx(expected_x)
    assert line.get_ydata() == pytest.approx([g for g in _val_gains(0.05).values()], abs=1e-12)


def test_a_missing_result_names_its_file(tree, tmp_path):
    root = tmp_path / "r"
    shutil.copytree(tree["root"], root)
    run = tree["spec"]["methods"][0]["runs"][1]
    (root / "eval" / run / "compbench_per_image.csv").unlink()
    with pytest.raises(MissingResultError, match=rf"eval/{run}/compbench_per_image\.csv"):
        related.table3(root, tree["spec"])
    (root / run / "metrics.csv").unlink()
    with pytest.raises(MissingResultError, match=rf"{run}/metrics\.csv"):
        related.related_wallclock(root, tree["spec"])
    spec = {"methods": [{**tree["spec"]["methods"][1], "runs": ["train/toy-mask/mixed/grpo/seed7"]}]}
    with pytest.raises(SystemExit, match=r"select/train/toy-mask/mixed/grpo/seed7/selection\.json"):
        main(
            [
                "report",
                "table3",
                "--runs-json",
                json.dumps(spec),
                "--results",
                str(root),
                "--out-prefix",
                str(tmp_path / "t"),
            ]
        )


def test_a_run_of_another_policy_than_its_base_is_refused():
    spec = {"methods": [{"label": "X", "base": "base/toy-mask", "runs": ["train/toy-nova/mixed/sim/seed0"]}]}
    with pytest.raises(ValueError, match="not a train/toy-mask/... run"):
        related.methods_from_spec(spec)
