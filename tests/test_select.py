"""Checkpoint selection (design.md §3.12): best-by-validation for baselines, a fixed step for the method."""

import json
import math

import pytest

from margrpo.cli import main
from margrpo.reporting.selection import parse_step, select_checkpoint


def _summary(vals, steps=None):
    steps = steps or [10 * (i + 1) for i in range(len(vals))]
    return {
        "run_dir": "results/train/p/r/grpo/seed0",
        "variant": "grpo",
        "steps": max(steps, default=0),
        "checkpoints": [{"step": s, "path": f"ckpt/step{s}/policy", "val_reward": v} for s, v in zip(steps, vals)],
        "base_val_reward": 0.1,
        "spec": {},
    }


def test_best_picks_highest_validation_reward():
    sel = select_checkpoint(_summary([0.2, 0.5, 0.3]), "best")
    assert (sel["step"], sel["rule"], sel["policy"], sel["val_reward"]) == (20, "best", "ckpt/step20/policy", 0.5)
    assert [c["step"] for c in sel["candidates"]] == [10, 20, 30]
    assert sel["variant"] == "grpo" and sel["base_val_reward"] == 0.1


def test_best_ties_go_to_the_earliest_step_whatever_the_listing_order():
    summary = _summary([0.4, 0.7, 0.7, 0.1], steps=[30, 20, 10, 40])  # listed out of order
    assert select_checkpoint(summary, "best")["step"] == 10


def test_best_skips_missing_validation_rewards():
    sel = select_checkpoint(_summary([None, float("nan"), 0.3]), "best")
    assert sel["step"] == 30
    with pytest.raises(ValueError, match="finite validation reward"):
        select_checkpoint(_summary([None, float("nan")]), "best")


def test_fixed_step_is_taken_even_if_not_best():
    sel = select_checkpoint(_summary([0.9, 0.1, 0.2]), "30")
    assert (sel["step"], sel["rule"], sel["val_reward"]) == (30, "fixed", 0.2)
    assert select_checkpoint(_summary([0.9, 0.1, 0.2]), 10)["rule"] == "fixed"


def test_last_takes_the_last_checkpoint_whatever_its_reward_or_the_listing_order():
    sel = select_checkpoint(_summary([0.9, 0.1, 0.2], steps=[30, 10, 20]), "last")
    assert (sel["step"], sel["rule"], sel["val_reward"]) == (30, "fixed", 0.9)
    assert select_checkpoint(_summary([0.9, 0.1, 0.2]), " LAST ")["step"] == 30


def test_fixed_step_missing_names_available_steps():
    with pytest.raises(ValueError, match=r"no checkpoint at step 25; available steps: \[10, 20, 30\]"):
        select_checkpoint(_summary([0.1, 0.2, 0.3]), 25)


def test_no_checkpoints_and_bad_step_are_errors():
    with pytest.raises(ValueError, match="no checkpoints"):
        select_checkpoint(_summary([]), "best")
    with pytest.raises(ValueError, match="'best', 'last' or a checkpoint step"):
        parse_step("latest")
    with pytest.raises(ValueError, match=">= 0"):
        parse_step("-1")


def test_cli_writes_strict_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the summary's checkpoint paths are relative to the working directory
    for step in (10, 20, 30):
        (tmp_path / f"ckpt/step{step}/policy").mkdir(parents=True)
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(_summary([0.2, float("nan"), 0.6])))
    out = tmp_path / "select" / "run" / "selection.json"
    assert main(["select", "--summary", str(summary), "--step", "best", "--out", str(out)]) == 0
    sel = json.loads(out.read_text())  # strict JSON: NaN written as null
    assert sel["step"] == 30 and sel["rule"] == "best" and sel["policy"] == "ckpt/step30/policy"
    assert sel["candidates"][1]["val_reward"] is None
    assert not [p for p in out.parent.iterdir() if p.name != "selection.json"]  # no temp files left

    assert main(["select", "--summary", str(summary), "--step", "10", "--out", str(out)]) == 0
    sel = json.loads(out.read_text())
    assert (sel["step"], sel["rule"]) == (10, "fixed") and math.isclose(sel["val_reward"], 0.2)

    with pytest.raises(ValueError, match="available steps"):
        main(["select", "--summary", str(summary), "--step", "15", "--out", str(out)])


def test_cli_fails_when_the_selected_checkpoint_is_missing(tmp_path, monkeypatch):
    """Issue #31.5: a summary pointing at a deleted checkpoint ends `select` itself, naming the summary and folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt/step10/policy").mkdir(parents=True)
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(_summary([0.2, 0.6])))
    out = tmp_path / "selection.json"
    with pytest.raises(
        SystemExit, match=r"summary.json: the selected checkpoint \(step 20\) folder ckpt/step20/policy does not exist"
    ):
        main(["select", "--summary", str(summary), "--step", "best", "--out", str(out)])
    assert not out.exists()
    assert main(["select", "--summary", str(summary), "--step", "10", "--out", str(out)]) == 0
