"""Resumable state (GRPO runs, pre-training, warm-up): resumed only under the spec that wrote it, and a
SIGKILL while a checkpoint is being saved, then a resume, reaches the uninterrupted result (design.md §6). What a run
leaves of the rest of its folder: test_run_folder.py."""

import csv
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import StopAt, make_trainer, pretrain, tiny_policy

from margrpo.infra.files import InputError, sha256_file

TESTS = Path(__file__).resolve().parent
METRICS = ("reward_mean", "policy_loss", "grad_norm_ar", "val_reward")


def log_steps(state_dir):
    with open(Path(state_dir) / "log.csv", newline="") as f:
        return [int(r["step"]) for r in csv.DictReader(f)]


def weights_relative_error(a, b) -> float:
    """||a - b|| / ||b|| over every tensor of the two state dicts as one vector."""
    x = torch.cat([t.flatten().double() for t in a.state_dict().values()])
    y = torch.cat([t.flatten().double() for t in b.state_dict().values()])
    return float((x - y).norm() / y.norm())


def assert_same_weights(a, b):
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


def tree_digest(folder: Path) -> dict:
    """Every file under `folder` and its sha256: what "nothing was deleted or changed" is checked against."""
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_run_under_a_changed_lr_stops_naming_it_and_deletes_nothing(tmp_path, logged):
    """Issue 59: the same out-dir with another lr used to empty state/. Now it stops, naming `lr` and both values
    and the two ways on, with every file as it was; --restart moves the old state aside and starts afresh."""
    run = tmp_path / "run"
    make_trainer(run, policy=tiny_policy("flow", seed=1), lr=1e-3).train()
    before = tree_digest(run / "state")
    changed = make_trainer(run, policy=tiny_policy("flow", seed=1), lr=2e-3)
    with pytest.raises(InputError) as err:
        changed.train()
    assert "grpo.lr: 0.001 there, 0.002 now" in str(err.value) and "--restart" in str(err.value)
    assert "Nothing was deleted" in str(err.value) and tree_digest(run / "state") == before
    rows = make_trainer(run, policy=tiny_policy("flow", seed=1), lr=2e-3).train(restart=True)
    (aside,) = run.glob("aside-*")
    assert tree_digest(aside / "state") == before  # moved whole, the lock aside (it stays with the folder)
    fresh = make_trainer(tmp_path / "fresh", policy=tiny_policy("flow", seed=1), lr=2e-3).train()
    for key in METRICS:
        assert rows[-1][key] == pytest.approx(fresh[-1][key], rel=1e-6, abs=1e-9), key
    make_trainer(run, policy=tiny_policy("flow", seed=1), lr=2e-3).train()
    assert "resumed from" in logged()  # the unchanged settings resume (here: nothing left to do)


def test_other_inputs_refuse_and_the_same_inputs_spelled_otherwise_resume(tmp_path, logged, monkeypatch):
    """Inputs count by content (their manifest), not by how their path is written: an absolute path and a
    relative one to the same folder resume; a folder holding other weights refuses, naming the input."""
    for name, seed in (("a", 1), ("b", 2)):
        tiny_policy("flow", seed=seed).save_pretrained(tmp_path / name)
    monkeypatch.chdir(tmp_path)

    def spec(path):
        return {"inputs": {"policy_dir": str(path), "toyclip_dir": None}}

    make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=1).train(spec(tmp_path / "a"))
    make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=2).train(spec("a"))
    log = logged()
    assert "resumed from" in log and "grpo.steps 1 -> 2" in log
    with pytest.raises(InputError, match=r"spec\.inputs\.policy_dir: 'checksums\.json:\w+' there"):
        make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=2).train(spec("b"))


def test_raising_steps_extends_the_run_to_the_longer_run_s_bits(tmp_path, logged):
    """`steps` (and the cadences) only extend a run: 2 steps then 3 in one folder reach the 3-step run's weights
    and rows bit for bit; fewer steps than the state has run refuse."""
    make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=2, val_every=2).train()
    longer = make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=3, val_every=1)
    rows = longer.train()
    assert "resuming with grpo.steps 2 -> 3, grpo.val_every 2 -> 1" in logged()
    full = make_trainer(tmp_path / "full", policy=tiny_policy("flow", seed=1), steps=3, val_every=1)
    rows_full = full.train()
    assert_same_weights(longer.policy, full.policy)
    assert [{k: r[k] for k in METRICS[:3]} for r in rows] == [{k: r[k] for k in METRICS[:3]} for r in rows_full]
    with pytest.raises(InputError, match="at step 3, past this run's grpo.steps 1"):
        make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=1).train()


@pytest.mark.parametrize("damage", ["header deleted", "header garbled", "checksums deleted"])
def test_a_damaged_header_falls_back_to_the_newest_intact_checkpoint(tmp_path, logged, damage):
    """Issue 59: a missing or unreadable trainer.pt used to read as "no run" and the intact state was deleted at
    the first save. Now the run resumes from the header copy in the newest checkpoint whose shards verify, says
    so, and ends where the uninterrupted run ends."""
    run = tmp_path / "run"
    make_trainer(run, policy=tiny_policy("flow", seed=1), steps=2).train()
    {
        "header deleted": lambda: (run / "state/trainer.pt").unlink(),
        "header garbled": lambda: (run / "state/trainer.pt").write_bytes(b"garbage"),
        "checksums deleted": lambda: (run / "state/checksums.json").unlink(),
    }[damage]()
    resumed = make_trainer(run, policy=tiny_policy("flow", seed=1), steps=3)
    rows = resumed.train()
    log = logged()
    assert "resuming from" in log and "ckpt-000002/train, the newest checkpoint" in log and "at step 2" in log
    full = make_trainer(tmp_path / "full", policy=tiny_policy("flow", seed=1), steps=3)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["reward_mean"] == full.train()[-1]["reward_mean"]
    assert_same_weights(resumed.policy, full.policy)


def test_a_header_and_shards_both_damaged_refuse_and_keep_everything(tmp_path):
    run = tmp_path / "run"
    make_trainer(run, policy=tiny_policy("flow", seed=1), steps=2).train()
    (run / "state/trainer.pt").unlink()
    shard = next(p for p in (run / "state/ckpt-000002/train").iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-8])
    before = tree_digest(run / "state")
    with pytest.raises(InputError, match=r"cannot be resumed .*\.distcp: sha256 differs"):
        make_trainer(run, policy=tiny_policy("flow", seed=1), steps=3).train()
    assert tree_digest(run / "state") == before


@pytest.mark.parametrize("name", [".metadata", "__0_0.distcp"])
def test_a_deleted_shard_is_an_error_naming_it(tmp_path, name):
    """Torch's CheckpointException or AssertionError traceback before issue 59."""
    run = tmp_path / "run"
    make_trainer(run, policy=tiny_policy("flow", seed=1), steps=2).train()
    (run / "state/ckpt-000002/train" / name).unlink()
    with pytest.raises(InputError, match=rf"ckpt-000002/train/{re.escape(name)}: listed in .* but missing"):
        make_trainer(run, policy=tiny_policy("flow", seed=1), steps=3).train()


def test_summary_is_strict_json_with_the_reason_for_each_null(tmp_path):
    trainer = make_trainer(tmp_path, steps=1)
    trainer.train()
    trainer.checkpoints = [
        c for c in trainer.checkpoints if c["step"] > 0
    ]  # no base validation: base_val_reward is NaN
    trainer.write_outputs({"variant": {"name": "x"}, "grpo": {"tau": float("-inf")}})
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

def dying(save, only=None):
    def wrapped(obj, path, *args, **kwargs):  # save number {kill_at} (of files named `only`) dies halfway through
        global count
        if only is not None and only not in str(path):
            return save(obj, path, *args, **kwargs)
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

def dying_after(save, behind=False):
    def wrapped(*args, **kwargs):  # call number {kill_at} finishes (`behind`: its writing), then the process dies
        global count
        count += 1
        out = save(*args, **kwargs)
        if count >= {kill_at}:
            if behind:
                out.result()
            os.kill(os.getpid(), signal.SIGKILL)
        return out
    return wrapped

{patch}
{run}
"""


def run_killed(tmp_path, setup, patch, run, kill_at):
    script = KILL_SCRIPT.format(
        tests=str(TESTS), setup=textwrap.dedent(setup), patch=patch, run=textwrap.dedent(run), kill_at=kill_at
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == -9, out.stdout[-2000:] + out.stderr[-3000:]  # SIGKILL


DCP = "import torch.distributed.checkpoint as dcp; "
KILLS = {  # what dies, and at which of its calls
    "header": ("torch.save = dying(torch.save, only='trainer.pt')", 2),
    "policy weights": ("st.save_file = dying(st.save_file)", 2),
    # every process's shards on disk, killed before they are checked and renamed in: step 2's, written behind
    # step 3, and the last step's, written at once
    "training state written behind": (DCP + "dcp.async_save = dying_after(dcp.async_save, behind=True)", 2),
    "training state": (DCP + "dcp.save = dying_after(dcp.save)", 1),
}


@pytest.mark.parametrize("during", list(KILLS))
def test_grpo_killed_while_saving_resumes_to_the_uninterrupted_result(tmp_path, logged, during):
    """save_every = 1: the kill lands in the step-2 checkpoint (its trainer.pt, its model.safetensors, or its
    training state, written behind step 3) or in the last step's training state."""
    patch, kill_at = KILLS[during]
    run_killed(
        tmp_path,
        "from helpers import make_trainer, tiny_policy",
        patch,
        "make_trainer('run', policy=tiny_policy('flow', seed=1), steps=3).train()",
        kill_at=kill_at,
    )
    resumed = make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=3)
    rows = resumed.train()
    assert "resumed from" in logged() and [r["step"] for r in rows] == [1, 2, 3]
    full = make_trainer(tmp_path / "full", policy=tiny_policy("flow", seed=1), steps=3)
    rows_full = full.train()
    for key in METRICS:
        assert rows[-1][key] == pytest.approx(rows_full[-1][key], rel=1e-6, abs=1e-9), key
    assert_same_weights(resumed.policy, full.policy)


# written by the code of commit 708ebe4 (a worktree of it, from its tests/, PYTHONPATH=../src): under
# margrpo.infra.kernels.apply_caps() and one thread, as the tests run, make_trainer('OUT', policy=tiny_policy('flow',
# seed=1), steps=3).train() with its train_step raising SystemExit once trainer.step == 2; OUT/state copied here
STATE_BEFORE_52 = TESTS / "data" / "state-before-52"


def test_a_checkpoint_written_before_torch_distributed_checkpoint_still_resumes(tmp_path, logged):
    """state/ as the trainer wrote it before issue 52 (2 of 3 steps of the tiny run below, trainer.pt holding the
    optimizer whole and the rows' KL term named `kl`): resumed, the third step reaches the uninterrupted run's
    metrics and weights, the old rows take the KL term's new name, and the next save writes the new format."""
    shutil.copytree(STATE_BEFORE_52, tmp_path / "run" / "state")
    resumed = make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=3)
    rows = resumed.train()
    log = logged()
    assert "resumed from" in log and "at step 2" in log and [r["step"] for r in rows] == [1, 2, 3]
    assert all("kl_paper" in r and "kl" not in r for r in rows)
    full = make_trainer(tmp_path / "full", policy=tiny_policy("flow", seed=1), steps=3)
    rows_full = full.train()
    # The stored steps ran on the CPU that wrote them (an AMD EPYC). On another CPU family this machine's own steps
    # differ in float32's last bits from the first one on (an AVX-512 Xeon: grad_norm_ar 9.194545 against 9.194422
    # at step 1, val_reward 2.2e-4 relative at step 3, the weights 1.4e-5), so they are compared within bounds that a
    # wrong resume breaks: the same resume with Adam's moments zeroed moves the weights by far more (checked below).
    for row, row_full in zip(rows, rows_full):
        for key in (*METRICS, "kl_paper"):
            assert row[key] == pytest.approx(row_full[key], rel=1e-3, abs=2e-7), key
    drift = weights_relative_error(resumed.policy, full.policy)
    assert drift < 1e-4
    wrong = _adam_moments_zeroed(STATE_BEFORE_52, tmp_path / "wrong" / "state")
    wrong_resume = make_trainer(wrong.parent, policy=tiny_policy("flow", seed=1), steps=3)
    wrong_resume.train()
    assert weights_relative_error(wrong_resume.policy, full.policy) > 100 * max(drift, 1e-6)
    header = torch.load(tmp_path / "run" / "state" / "trainer.pt", weights_only=True)
    assert header["format"] == 2 and "optimizer" not in header
    assert (tmp_path / "run" / "state" / "ckpt-000003" / "train" / ".metadata").is_file()


def _adam_moments_zeroed(state: Path, to: Path) -> Path:
    """A copy of an old-format run state whose optimizer forgot its moments (as a resume that lost them would)."""
    shutil.copytree(state, to)
    header = torch.load(to / "trainer.pt", weights_only=True)
    for moments in header["optimizer"]["state"].values():
        for key in ("exp_avg", "exp_avg_sq"):
            moments[key].zero_()
    torch.save(header, to / "trainer.pt")
    (to / "checksums.json").write_text(json.dumps({"trainer.pt": sha256_file(to / "trainer.pt")}))
    return to


def test_only_the_latest_checkpoint_keeps_its_training_state(tmp_path):
    """Every checkpoint keeps its policy folder (selection reads them); the training state of all but the latest
    is removed once the next is on disk, and a damaged shard is refused naming its file."""
    trainer = make_trainer(tmp_path, policy=tiny_policy("flow", seed=1), steps=3)
    trainer.train()
    state = tmp_path / "state"
    assert [p.parent.name for p in sorted(state.glob("ckpt-*/train"))] == ["ckpt-000003"]
    assert len(list(state.glob("ckpt-*/policy"))) == 3
    shard = next((state / "ckpt-000003" / "train").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 1]))
    again = make_trainer(tmp_path, policy=tiny_policy("flow", seed=1), steps=3)
    with pytest.raises(InputError, match=r"(?s)distcp: sha256 differs.*cannot be resumed"):
        again.try_resume()


def test_a_restart_sets_aside_a_state_whose_header_reads_but_whose_shards_do_not_verify(tmp_path, logged):
    """Issue 69: `--restart` refused such a state again (the shards were checked only once it was accepted), so a
    workflow's rerun, which passes --restart, kept failing until someone moved state/ by hand."""
    run = tmp_path / "run"
    make_trainer(run, policy=tiny_policy("flow", seed=1), steps=2).train()
    shard = next((run / "state/ckpt-000002/train").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-8])
    before = tree_digest(run / "state")
    with pytest.raises(InputError, match=r"(?s)distcp: sha256 differs.*cannot be resumed.*Nothing was deleted"):
        make_trainer(run, policy=tiny_policy("flow", seed=1), steps=2).train()
    assert tree_digest(run / "state") == before
    logged()
    rows = make_trainer(run, policy=tiny_policy("flow", seed=1), steps=2).train(restart=True)
    assert "--restart: moved it to" in logged() and [r["step"] for r in rows] == [1, 2]
    (aside,) = run.glob("aside-*")
    assert tree_digest(aside / "state") == before
    fresh = make_trainer(tmp_path / "fresh", policy=tiny_policy("flow", seed=1), steps=2).train()
    assert [r["reward_mean"] for r in rows] == [r["reward_mean"] for r in fresh]


def test_a_full_disk_while_the_policy_weights_are_written_is_a_one_line_error(tmp_path, monkeypatch):
    """Issue 69: safetensors' writer reports a full disk as its own SafetensorError (the errno in its text alone),
    which ended in its traceback; now it is the NoSpaceError the training state's writes give, naming the folder."""
    import safetensors.torch
    from safetensors import SafetensorError

    from margrpo.infra.files import NoSpaceError

    def full(*args, **kwargs):  # what safetensors raises when write(2) fails with ENOSPC
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    trainer = make_trainer(tmp_path, policy=tiny_policy("flow", seed=1), steps=1)
    monkeypatch.setattr(safetensors.torch, "serialize_file", full)
    with pytest.raises(NoSpaceError, match=r"^no space left on .*ckpt-000001.*os error 28.*free space") as err:
        trainer.train()
    assert "\n" not in str(err.value)


def test_pretraining_killed_while_saving_resumes_without_duplicate_log_rows(tmp_path, logged):
    """save_every = 2 of 6 steps: the kill lands in the step-4 checkpoint, after steps 3-4 reached log.csv."""
    run_killed(
        tmp_path,
        "from helpers import pretrain",
        "torch.save = dying(torch.save)",
        "pretrain('state', steps=6)",
        kill_at=2,
    )
    assert log_steps(tmp_path / "state") == [1, 2, 3, 4]  # logged past the last complete checkpoint (step 2)
    resumed = pretrain(tmp_path / "state", steps=6)
    assert "resumed from" in logged()
    assert log_steps(tmp_path / "state") == [1, 2, 3, 4, 5, 6]
    assert_same_weights(resumed, pretrain(tmp_path / "full", steps=6))


@pytest.mark.parametrize("why", ["time limit", "SIGTERM", "SIGINT"])
def test_a_run_stopped_before_its_time_limit_saves_and_resumes_to_the_uninterrupted_result(
    tmp_path, logged, monkeypatch, why
):
    """save_every = 4 of 4 steps: the stop after step 2 writes a checkpoint of its own (not one for selection), the
    stage's exit status says "run again", and the run started again ends where the uninterrupted one does."""
    import os
    import signal
    import time

    from margrpo.infra import stopping

    trainer = make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=4, save_every=4, val_every=2)
    steps_seen = []

    class AtStepTwo(stopping.StopRequest):
        """The job's stop arrives as step 2 ends."""

        def reason(self, next_seconds):
            steps_seen.append(trainer.step)
            if trainer.step == 2:
                if why in ("SIGTERM", "SIGINT"):  # as SLURM's requeue or preemption sends it; Ctrl-C at a terminal
                    os.kill(os.getpid(), getattr(signal, why))
                else:  # SLURM's end time 10 s away: less than a step, a save and the margin
                    self.end_time = time.time() + 10
                    monkeypatch.setattr(stopping, "job_end_time", lambda: self.end_time)
            return super().reason(next_seconds)

    stop = AtStepTwo(read_limit=False)
    try:
        rows = trainer.train(stop=stop)
    finally:
        stop.close()
    assert signal.getsignal(signal.SIGTERM) is not stop._on_signal  # handlers restored
    assert signal.getsignal(signal.SIGINT) is not stop._on_signal
    assert steps_seen == [1, 2] and [r["step"] for r in rows] == [1, 2], steps_seen
    assert trainer.stopped.startswith(why if why != "time limit" else "10 s left"), trainer.stopped
    assert (tmp_path / "run/state/ckpt-000002").is_dir()
    assert [c["step"] for c in trainer.checkpoints] == [0]  # step 2 was validated but not listed: it stopped there
    resumed = make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), steps=4, save_every=4, val_every=2)
    rows = resumed.train()
    assert "resumed from" in logged() and [r["step"] for r in rows] == [1, 2, 3, 4]
    full = make_trainer(tmp_path / "full", policy=tiny_policy("flow", seed=1), steps=4, save_every=4, val_every=2)
    rows_full = full.train()
    for a, b in zip(rows, rows_full):
        for key in METRICS:
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9, nan_ok=True), (a["step"], key)
    assert_same_weights(resumed.policy, full.policy)
    assert [c["step"] for c in resumed.checkpoints] == [c["step"] for c in full.checkpoints]


def test_a_second_ctrl_c_interrupts_at_once(monkeypatch):
    """The first SIGINT asks for a save and a stop between steps; a second one is Python's KeyboardInterrupt (once
    REPEAT_S has passed: a copy sooner is the same Ctrl-C, tests/test_stopping.py)."""
    import os
    import signal

    from margrpo.infra import stopping

    monkeypatch.setattr(stopping, "REPEAT_S", 0.0)
    before = signal.getsignal(signal.SIGINT)  # Python's default; SIG_IGN where the suite runs in the background
    stop = stopping.StopRequest(read_limit=False)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.reason(0.0) == "SIGINT received"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs at once, in this (the main) thread
    finally:
        stop.close()
    assert signal.getsignal(signal.SIGINT) is before


# Issue 70: a stop inside a step gives the step up (before its first optimizer step) and saves the state of its start
GIVEN_UP = dict(steps=4, save_every=4, val_every=2, updates_per_rollout=2)  # two optimizer steps a step
TIMING = ("seconds", "time", "wall", "mem", "peak")


def run_numbers(trainer) -> str:
    """A run's metrics rows without their timings, its checkpoints for selection and their weights, as one string:
    two runs are the same bits where these are equal."""
    rows = [{k: v for k, v in r.items() if not any(t in k for t in TIMING)} for r in trainer.rows]
    ckpts = [{**c, "path": c["path"] and Path(c["path"]).name} for c in trainer.checkpoints]
    folders = [Path(c["path"]) for c in trainer.checkpoints if c["path"]]
    weights = {f"{f.name}/{p.relative_to(f)}": sha256_file(p) for f in folders for p in f.rglob("*.safetensors")}
    return json.dumps({"rows": rows, "checkpoints": ckpts, "weights": dict(sorted(weights.items()))}, sort_keys=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    torch.set_num_threads(1)  # as every test runs (conftest.py), before its function-scoped fixture sets it
    full = make_trainer(tmp_path_factory.mktemp("full"), policy=tiny_policy("flow", seed=1), **GIVEN_UP)
    full.train()
    return full


@pytest.mark.parametrize(
    "at,kw",
    [
        ("rollout", dict(ar_step=2)),  # as step 3's AR step 2 begins
        ("replay", dict(update=0, part=1)),  # before step 3's second backward pass
        ("second update", dict(update=1, part=0)),  # after step 3's first optimizer step: not given up
        ("rollout, step 2 saved", dict(ar_step=1, save_every=2)),  # its periodic checkpoint is kept
    ],
)
def test_a_stop_inside_a_step_saves_the_state_of_its_start_and_the_resumed_run_is_the_uninterrupted_one(
    tmp_path, logged, uninterrupted, at, kw
):
    """A SIGTERM in step 3 (rollout, or replay before the first optimizer step): the step is given up at once (no AR
    step or backward pass after the request), its gradients dropped, and the state of its start (step 2) saved (or
    step 2's periodic checkpoint kept); a stop after the first optimizer step waits for the step, saved as between
    steps. The resumed run repeats step 3 from its keyed streams: the uninterrupted run's bits."""
    from contextlib import nullcontext

    from margrpo.grpo.rollout import each_ar_pass_within
    from margrpo.infra.stopping import StopRequest

    config = {**GIVEN_UP, "save_every": kw.pop("save_every", GIVEN_UP["save_every"])}
    stopper = StopAt(2, **kw)
    trainer = make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), hooks=stopper, **config)
    saves, save = [], trainer.save  # (step, whether the request had come)
    trainer.save = lambda background=False: (saves.append((trainer.step, stopper.sent)), save(background))[1]
    passes = []  # whether the request had come as each AR pass began
    stop = StopRequest(read_limit=False)
    try:
        with each_ar_pass_within(lambda policy: (passes.append(stopper.sent), nullcontext())[1]):
            trainer.train(stop=stop)
    finally:
        stop.close()
    assert stopper.sent and trainer.stopped == "SIGTERM received", trainer.stopped
    assert True not in passes  # no AR pass began after the request
    if at == "second update":  # the step ran on to its end, and saved as between steps
        assert stopper.after == [("part", 1, 1)] and trainer.step == 3 and saves == [(3, True)]
    else:  # nothing of the step ran after the request
        assert stopper.after == [] and trainer.step == 2 and [r["step"] for r in trainer.rows] == [1, 2]
        where = (
            "before backward pass 2 of the first update"
            if at == "replay"
            else f"in the rollout, before AR step {kw['ar_step'] + 1} of 4"
        )
        assert saves == [(2, config["save_every"] != 2)] and f"giving up step 3 in progress ({where})" in logged()
        assert all(p.grad is None for p in trainer.policy.parameters())
    assert torch.load(tmp_path / "run/state/trainer.pt", weights_only=True)["step"] == trainer.step
    resumed = make_trainer(tmp_path / "run", policy=tiny_policy("flow", seed=1), **config)
    resumed.train()
    assert "resumed from" in logged() and [r["step"] for r in resumed.rows] == [1, 2, 3, 4]
    assert_same_weights(resumed.policy, uninterrupted.policy)
    if config["save_every"] == GIVEN_UP["save_every"]:
        assert run_numbers(resumed) == run_numbers(uninterrupted)
    else:  # the same rows and weights; step 2 listed besides
        assert json.loads(run_numbers(resumed))["rows"] == json.loads(run_numbers(uninterrupted))["rows"]
        assert [c["step"] for c in resumed.checkpoints] == [0, 2, 4]


def test_a_periodic_save_is_written_behind_the_next_step_and_named_once_complete(tmp_path, monkeypatch):
    """The training state of a checkpoint before the last step is written behind the next step: its header (the
    rows as they were at its step) is written when the next save begins, the last step's at once; the run returns
    with every save on disk."""
    import torch.distributed.checkpoint as dcp

    from margrpo.grpo.checkpoints import Checkpointer

    trainer = make_trainer(tmp_path / "run", steps=3)
    done, complete, behind, real = [], Checkpointer._complete, [], dcp.async_save

    def seen(self, header, *args):
        done.append((header["step"], len(header["rows"]), trainer.step))  # the checkpoint's, its rows, the run's
        return complete(self, header, *args)

    monkeypatch.setattr(Checkpointer, "_complete", seen)
    monkeypatch.setattr(dcp, "async_save", lambda *a, **k: (behind.append(trainer.step), real(*a, **k))[1])
    trainer.train()
    assert behind == [1, 2] and [d[:2] for d in done] == [(1, 1), (2, 2), (3, 3)]
    assert done[0][2] >= 1 and done[1][2] >= 2  # named once its writing was over: at the next step's start or later
    assert torch.load(tmp_path / "run/state/trainer.pt", weights_only=True)["step"] == 3
    assert not list((tmp_path / "run/state").glob(".*.tmp"))


def test_a_save_written_behind_that_fails_leaves_the_previous_checkpoint_and_says_why(tmp_path, monkeypatch):
    """Step 2's training state fails in the background (a disk gone): the next save raises that error, removes the
    partial folder, and state/ still names step 1, which resumes."""
    from concurrent.futures import Future

    import torch.distributed.checkpoint as dcp

    calls, real = [], dcp.async_save

    def failing_second(*args, **kwargs):
        calls.append(1)
        if len(calls) < 2:
            return real(*args, **kwargs)
        failed = Future()
        failed.set_exception(OSError("No space left on device"))
        return failed

    monkeypatch.setattr(dcp, "async_save", failing_second)
    trainer = make_trainer(tmp_path / "run", steps=3)
    with pytest.raises(OSError, match="No space left"):
        trainer.train()
    state = tmp_path / "run/state"
    assert torch.load(state / "trainer.pt", weights_only=True)["step"] == 1 and not list(state.glob(".*.tmp"))
    monkeypatch.setattr(dcp, "async_save", real)
    resumed = make_trainer(tmp_path / "run", steps=3)
    resumed.train()
    assert [r["step"] for r in resumed.rows] == [1, 2, 3]
