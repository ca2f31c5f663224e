"""The held-out best step (issue 71): the best validation step chosen on one half of the prompts and scored on the
other. val_gain's "best" is a maximum of noisy values, above 0 for runs that learned nothing; "best, held out" is
not, and the claims' val@best-heldout scores each prompt at a step it did not choose."""

import math
import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from margrpo.infra.files import atomic_write_json
from margrpo.reporting import tables
from margrpo.reporting.paired import difference, heldout_best, load_run


def _write_run(root, run, base, steps: dict[int, np.ndarray]) -> None:
    """summary.json (per-prompt scores of the base and of each validated step) and the metrics.csv beside it."""
    ckpts = [
        {"step": s, "val_reward": float(np.mean(v)), "val_scores": [float(x) for x in v], "path": None}
        for s, v in steps.items()
    ]
    summary = {
        "checkpoints": ckpts,
        "base_val_reward": float(np.mean(base)),
        "base_val_scores": [float(x) for x in base],
    }
    atomic_write_json(root / run / "summary.json", summary)
    val = {c["step"]: c["val_reward"] for c in ckpts}
    rows = range(1, max(steps) + 1)
    pd.DataFrame(
        {
            "step": list(rows),
            "grad_norm_ar": 1.0,
            "grad_var_ar": 1.0,
            "val_reward": [val.get(s, math.nan) for s in rows],
        }
    ).to_csv(root / run / "metrics.csv", index=False)


def _mean_se(t: tables.Table, method: str, metric: str) -> tuple[float, float]:
    """A val_gain row's mean of `metric` and its standard error (the t half-width over its runs, undone)."""
    row = t.data[t.data["method"] == method].iloc[0]
    mean, half, n = (row[f"gain/{metric}/{s}"] for s in ("mean", "ci", "n"))
    return float(mean), float(half) / stats.t.ppf(0.975, n - 1)


def test_under_the_null_best_is_above_zero_and_held_out_best_is_not(tmp_path):
    """400 runs whose 4 validated steps are the base's scores plus zero-mean noise on 48 prompts: nothing learned."""
    rng = np.random.default_rng(71)
    runs = []
    for seed in range(400):
        run = f"train/p/r/grpo/seed{seed}"
        base = rng.uniform(0.3, 0.7, 48)
        _write_run(tmp_path, run, base, {s: base + rng.normal(0, 0.1, 48) for s in (1, 2, 3, 4)})
        runs.append(run)
    t = tables.val_gain(tmp_path, {"runs": runs})
    best, best_se = _mean_se(t, "GRPO", "best")
    held, held_se = _mean_se(t, "GRPO", "best, held out")
    print(f"null: best {best:+.5f} (se {best_se:.5f}), best held out {held:+.5f} (se {held_se:.5f})")
    assert best > 3 * best_se
    assert abs(held) < 3 * held_se


def test_a_run_that_improves_by_one_at_one_step_is_recovered(tmp_path):
    rng = np.random.default_rng(2)
    base = rng.uniform(0.3, 0.7, 48)
    steps = {s: base + rng.normal(0, 0.1, 48) + (1.0 if s == 3 else 0.0) for s in (1, 2, 3, 4)}
    _write_run(tmp_path, "train/p/r/fix/seed0", base, steps)
    t = tables.val_gain(tmp_path, {"runs": ["train/p/r/fix/seed0"]})
    assert t.data.iloc[1]["gain/best, held out/mean"] == pytest.approx(1.0, abs=0.05)
    scores = load_run(tmp_path, "train/p/r/fix/seed0")
    assert np.array_equal(scores.heldout, steps[3])  # both halves choose step 3, so every prompt is scored there


def test_a_small_example_by_hand(tmp_path):
    """4 prompts, base 0. Even prompts (0, 2) choose step 1 (mean 1.5); it scores the odd ones: (0 + 1) / 2 = 0.5.
    Odd prompts (1, 3) tie steps 2 and 3 (mean 1), the earliest wins: step 2 scores the even ones: (0 + 1) / 2 = 0.5.
    Held out: 0.5; best: the maximum of the full means, 1.0 (steps 1 and 3)."""
    base = np.zeros(4)
    steps = {1: np.array([3.0, 0, 0, 1]), 2: np.array([0.0, 2, 1, 0]), 3: np.array([1.0, 1, 1, 1])}
    run = "train/p/r/grpo/seed0"
    _write_run(tmp_path, run, base, steps)
    out = heldout_best([{"step": s, "val_reward": 0.0, "val_scores": list(v)} for s, v in steps.items()], "here")
    assert out.tolist() == [0.0, 0.0, 1.0, 1.0]  # even prompts at step 2, odd ones at step 1
    row = tables.val_gain(tmp_path, {"runs": [run]}).data.iloc[1]
    assert row["gain/best/mean"] == 1.0 and row["gain/best, held out/mean"] == 0.5
    d = difference({0: load_run(tmp_path, run)}, None, "val@best-heldout", 0.95)
    assert d["diff"] == 0.5 and d["n_units"] == 4


def test_runs_without_per_prompt_scores_name_their_summary(tmp_path):
    run = "train/p/r/grpo/seed0"
    _write_run(tmp_path, run, np.zeros(4), {1: np.ones(4)})
    path = tmp_path / run / "summary.json"
    summary = {"checkpoints": [{"step": 1, "val_reward": 1.0, "path": None}], "base_val_reward": 0.0}
    atomic_write_json(path, {**summary, "base_val_scores": [0.0] * 4})  # a summary from before val_scores
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*val_scores"):
        tables.val_gain(tmp_path, {"runs": [run]})
    atomic_write_json(path, summary)
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*base_val_scores"):
        tables.val_gain(tmp_path, {"runs": [run]})
    _write_run(tmp_path, run, np.zeros(1), {1: np.ones(1)})  # one prompt: no two halves
    with pytest.raises(ValueError, match=re.escape(str(path)) + ".*two halves"):
        tables.val_gain(tmp_path, {"runs": [run]})
