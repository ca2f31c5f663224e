"""Resumable state (GRPO runs, pre-training, warm-up): resumed only under the spec that wrote it, and a
SIGKILL while a checkpoint is being saved, then a resume, reaches the uninterrupted result (DESIGN 6)."""

import csv
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import PROMPTS, tiny_policy
from test_trainer import make_trainer

from margrpo.grpo.trainer import write_outputs
from margrpo.toylab.pretraining import PretrainConfig, train

TESTS = Path(__file__).resolve().parent
METRICS = ("reward_mean", "policy_loss", "grad_norm_ar", "val_reward")


def batches(n, generator):
    """Random images and prompts, drawn from the training generator (so a resume draws the same)."""
    return torch.rand(n, 3, 64, 64, generator=generator), [PROMPTS[i % len(PROMPTS)] for i in range(n)]


def pretrain(state_dir, steps=4, policy=None, **kw):
    cfg = PretrainConfig(steps=steps, batch_size=2, warmup_steps=1, save_every=2, precision="no", **kw)
    return train(policy or tiny_policy("flow", seed=3), batches, cfg, state_dir, log_path=Path(state_dir) / "log.csv")


def log_steps(state_dir):
    with open(Path(state_dir) / "log.csv", newline="") as f:
        return [int(r["step"]) for r in csv.DictReader(f)]


def assert_same_weights(a, b):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


def test_grpo_run_with_a_changed_spec_starts_fresh(tmp_path, logged):
    """Same out-dir, new lr: the old state is not resumed (the summary used to claim the new lr over the old run)."""
    make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), lr=1e-3).train()
    changed = make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), lr=2e-3)
    rows = changed.train()
    assert "not resuming from" in logged()
    fresh = make_trainer(tmp_path / "fresh", policy=tiny_policy("flow", seed=1), lr=2e-3).train()
    for key in METRICS:
        assert rows[-1][key] == pytest.approx(fresh[-1][key], rel=1e-6, abs=1e-9), key
    same = make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), lr=2e-3, steps=2)
    same.train()
    assert "resumed from" in logged()  # the unchanged spec resumes (here: nothing left to do)


def test_grpo_run_with_other_inputs_starts_fresh(tmp_path, logged):
    """The stage's part of the spec (base policy folder, reward, seed, ...) counts as much as the trainer's."""
    make_trainer(tmp_path, policy=tiny_policy("flow", seed=1)).train({"inputs": {"policy_dir": "results/pretrain/toy-nova-aaaaaaaa"}})
    make_trainer(tmp_path, policy=tiny_policy("flow", seed=1)).train({"inputs": {"policy_dir": "results/pretrain/toy-nova-bbbbbbbb"}})
    assert "not resuming from" in logged()


def test_summary_is_strict_json_with_the_reason_for_each_null(tmp_path):
    trainer = make_trainer(tmp_path, steps=1)
    trainer.train()
    trainer.checkpoints = [c for c in trainer.checkpoints if c["step"] > 0]  # no base validation: base_val_reward is NaN
    write_outputs(trainer, {"variant": {"name": "x"}, "grpo": {"tau": float("-inf")}})
    text = (tmp_path / "summary.json").read_text()
    summary = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in summary.json"))
    assert summary["base_val_reward"] is None and summary["spec"]["grpo"]["tau"] is None
    assert summary["non_finite"] == {"base_val_reward": "nan", "spec.grpo.tau": "-inf"}


def test_trainer_state_loads_with_weights_only(tmp_path):
    trainer = make_trainer(tmp_path, steps=1)
    trainer.train()
    state = torch.load(tmp_path / "state/trainer.pt", weights_only=True)
    assert state["step"] == 1 and state["spec_hash"] == trainer.spec_hash


def test_pretraining_with_changed_settings_starts_fresh(tmp_path, logged):
    """New steps (or lr, seed) over an existing state/ used to return the old model."""
    pretrain(tmp_path / "state", steps=2)
    longer = pretrain(tmp_path / "state", steps=4)
    assert "not resuming from" in logged()
    assert_same_weights(longer, pretrain(tmp_path / "fresh", steps=4))
    assert log_steps(tmp_path / "state") == [1, 2, 3, 4]


def test_pretraining_after_a_width_change_starts_fresh_instead_of_crashing(tmp_path, logged):
    pretrain(tmp_path, steps=2)
    wider = pretrain(tmp_path, steps=2, policy=tiny_policy("flow", seed=3, width=48))
    assert "not resuming from" in logged() and wider.config.width == 48


KILL_SCRIPT = """
import io, os, signal, sys, torch
sys.path.insert(0, {tests!r})
torch.set_num_threads(1)
import safetensors.torch as st
{setup}
count, SAVE = 0, torch.save

def dying(save):
    def wrapped(obj, path, *args, **kwargs):  # save number {kill_at} dies halfway through its file
        global count
        count += 1
        if count < {kill_at}:
            return save(obj, path, *args, **kwargs)
        buf = io.BytesIO()
        SAVE(dict(obj), buf)
        with open(path, "wb") as f:
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return wrapped

{patch}
{run}
"""


def run_killed(tmp_path, setup, patch, run, kill_at):
    script = KILL_SCRIPT.format(tests=str(TESTS), setup=textwrap.dedent(setup), patch=patch, run=textwrap.dedent(run), kill_at=kill_at)
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == -9, out.stdout[-2000:] + out.stderr[-3000:]  # SIGKILL


@pytest.mark.parametrize("during", ["trainer state", "policy weights"])
def test_grpo_killed_while_saving_resumes_to_the_uninterrupted_result(tmp_path, logged, during):
    """save_every = 1: the kill lands in the step-2 checkpoint (its trainer.pt or its model.safetensors)."""
    patch = "torch.save = dying(torch.save)" if during == "trainer state" else "st.save_file = dying(st.save_file)"
    run_killed(tmp_path, "from test_trainer import make_trainer\nfrom helpers import tiny_policy",
               patch, "make_trainer('run', policy=tiny_policy('flow', seed=1), steps=3).train()", kill_at=2)
    resumed = make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=3)
    rows = resumed.train()
    assert "resumed from" in logged() and [r["step"] for r in rows] == [1, 2, 3]
    full = make_trainer(tmp_path / "full", policy=tiny_policy("flow", seed=1), steps=3)
    rows_full = full.train()
    for key in METRICS:
        assert rows[-1][key] == pytest.approx(rows_full[-1][key], rel=1e-6, abs=1e-9), key
    assert_same_weights(resumed.policy, full.policy)


def test_pretraining_killed_while_saving_resumes_without_duplicate_log_rows(tmp_path, logged):
    """save_every = 2 of 6 steps: the kill lands in the step-4 checkpoint, after steps 3-4 reached log.csv."""
    run_killed(tmp_path, "from test_resume import pretrain", "torch.save = dying(torch.save)", "pretrain('state', steps=6)", kill_at=2)
    assert log_steps(tmp_path / "state") == [1, 2, 3, 4]  # logged past the last complete checkpoint (step 2)
    resumed = pretrain(tmp_path / "state", steps=6)
    assert "resumed from" in logged()
    assert log_steps(tmp_path / "state") == [1, 2, 3, 4, 5, 6]
    assert_same_weights(resumed, pretrain(tmp_path / "full", steps=6))
