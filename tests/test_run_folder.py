"""What a run does with its run folder (issues #36 and 59): `margrpo train` deletes nothing it did not write (a fresh
start, a resume, a run under other settings, --restart), one train job at a time writes a folder, and a folder that
cannot be written is an error naming it. Resuming the state a run left: test_resume.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import USER_FILES, assert_user_files_kept, plant_user_files, tiny_policy, train_inputs

TESTS = Path(__file__).resolve().parent


class Interrupted(Exception):
    """Stands for a job killed after its first checkpoint: the next invocation of the same spec continues from it."""


def test_margrpo_train_deletes_nothing_it_did_not_write(tmp_path, monkeypatch, logged):
    """Issue #36: a run deletes nothing it did not write. Files a user put in the run folder, in state/ (before any
    trainer state was there), in tb/grpo/, beside a checkpoint, or under names like the trainer's own, outlive a
    fresh start, a resume that continues, and a run under other settings, which stops (issue 59), then with --restart
    moves what the trainer wrote aside (deleting nothing)."""
    from margrpo.cli import main
    from margrpo.grpo.trainer import GRPOTrainer

    spec, run = train_inputs(tmp_path), tmp_path / "run"

    def train(spec, *flags):
        main(
            [
                "train",
                "--policy-dir",
                str(tmp_path / "policy"),
                "--suites-dir",
                str(tmp_path / "suites"),
                "--spec-json",
                json.dumps(spec),
                "--out-dir",
                str(run),
                "--threads",
                "1",
                *flags,
            ]
        )

    plant_user_files(run)
    save = GRPOTrainer.save

    def save_then_die(self, background=False):
        save(self, background)
        self.finish_saves()  # killed once the checkpoint is on disk
        raise Interrupted

    with monkeypatch.context() as patch:
        patch.setattr(GRPOTrainer, "save", save_then_die)
        with pytest.raises(Interrupted):
            train(spec)  # a fresh start, killed after its step-1 checkpoint
    assert (run / "state/trainer.pt").is_file() and (run / "state/ckpt-000001/policy/checksums.json").is_file()
    assert_user_files_kept(run, "fresh start")
    logged()
    train(spec)  # the same spec: continues from step 1 to step 2
    assert "resumed from" in logged() and json.loads((run / "summary.json").read_text())["steps"] == 2
    assert_user_files_kept(run, "resume")
    (run / "state/.trainer.pt.x1y2z3w4.tmp.pt").write_bytes(b"torn")  # the temporary file of a killed trainer.pt write
    events = sorted((run / "tb/grpo").glob("events.out.tfevents.*"))
    assert len(events) == 2  # one per invocation
    other = {**spec, "grpo": {**spec["grpo"], "lr": spec["grpo"]["lr"] * 2}}
    with pytest.raises(SystemExit, match="grpo.lr: .* there, .* now"):  # other settings: stops, deleting nothing
        train(other)
    assert (run / "state/ckpt-000002/train").is_dir() and all(p.exists() for p in events)
    assert not (run / "state/.trainer.pt.x1y2z3w4.tmp.pt").exists()  # a killed write's leftover goes at any start
    train(other, "--restart")  # starts afresh, the earlier run moved aside
    assert "moved it to" in logged() and json.loads((run / "summary.json").read_text())["steps"] == 2
    (aside,) = run.glob("aside-*")
    for name, data in USER_FILES.items():  # each where it was, or moved aside with the checkpoint it sat beside
        assert data in {p.read_bytes() for p in (run / name, aside / name) if p.is_file()}, name
    assert (aside / "state/ckpt-000002/train").is_dir() and (aside / "state/trainer.pt").is_file()
    assert all((aside / "tb/grpo" / p.name).is_file() for p in events) and not any(p.exists() for p in events)
    assert len(list((run / "tb/grpo").glob("events.out.tfevents.*"))) == 1


def test_a_fresh_start_removes_what_a_save_wrote_and_keeps_what_it_did_not(tmp_path):
    """clear_written_state's rules (issue #36), on a state/ built by the savers themselves: a checkpoint goes file by
    file, as its manifest lists them; what the manifest does not list stays, with its folders."""
    from margrpo.grpo.run_files import clear_written_state
    from margrpo.infra.files import checked_path

    state, elsewhere = tmp_path / "state", tmp_path / "frozen"
    (elsewhere / "vae").mkdir(parents=True)
    (elsewhere / "vae/weights.bin").write_bytes(b"frozen")
    with checked_path(state / "trainer.pt") as tmp:
        tmp.write_bytes(b"state")
    written = []
    for step in (1, 2, 5):
        policy = state / f"ckpt-{step:06d}" / "policy"
        tiny_policy().save_pretrained(policy)
        (policy / "vae").symlink_to(elsewhere / "vae", target_is_directory=True)  # as NOVA links its frozen parts
        (policy / ".model.safetensors.ab12cd34.tmp.safetensors").write_bytes(b"torn")  # a killed rewrite's temporary
        written += [p for p in policy.parent.rglob("*")]
    (state / "ckpt-000003/.policy.ab12cd34.tmp/tokenizer").mkdir(parents=True)  # atomic_dir's folder of a killed save
    (state / "ckpt-000004/.policy.old").mkdir(parents=True)
    tiny_policy().save_pretrained(state / "ckpt-000004/.policy.old")  # atomic_dir's old folder, moved aside
    mine = {
        "ckpt-000002/notes.txt": b"beside",
        "ckpt-000005/policy/notes.txt": b"inside, unlisted",
        "ckpt-000005/policy/tokenizer/mine.json": b"{}",
        "ckpt-000006/policy/config.json": b"{}",  # no manifest
        "ckpt-000007/policy/checksums.json": b"not a manifest",
        "ckpt-000007/policy/model.safetensors": b"x",
        "trainer.pt.bak": b"b",
        ".trainer.pt.old": b"o",
        "ckpt-1/x": b"x",
        "policy/checksums.json": b"{}",
    }
    for name, data in mine.items():
        (state / name).parent.mkdir(parents=True, exist_ok=True)
        (state / name).write_bytes(data)
    tiny_policy().save_pretrained(elsewhere / "ckpt/policy")
    (state / "ckpt-000008").symlink_to(elsewhere / "ckpt", target_is_directory=True)  # a link: never cleared through

    clear_written_state(state)
    left = sorted(p.relative_to(state).as_posix() for p in state.rglob("*") if p.is_file() or p.is_symlink())
    assert left == sorted([*mine, "ckpt-000008"]) and (elsewhere / "ckpt/policy/model.safetensors").is_file()
    assert all((state / name).read_bytes() == data for name, data in mine.items())
    assert (elsewhere / "vae/weights.bin").read_bytes() == b"frozen"  # the link went, never what it leads to
    assert (
        not (state / "ckpt-000001").exists()
        and not (state / "ckpt-000003").exists()
        and not (state / "ckpt-000004").exists()
    )
    assert sorted(p.name for p in (state / "ckpt-000005/policy").iterdir()) == ["notes.txt", "tokenizer"]


_HOLDER = """
import sys, time
sys.path.insert(0, {src!r})
from margrpo.infra.run_lock import hold_run_folder
with hold_run_folder({state!r}):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_train_job_into_one_run_folder_fails_at_once_naming_the_first(tmp_path):
    """Issue 59 item 4: `margrpo train` into a folder another live job writes stops before it reads anything,
    naming that job's pid and host; once the holder dies (SIGKILL: no cleanup), its lock no longer blocks."""
    import os
    import socket

    from margrpo.cli import main

    spec, run = train_inputs(tmp_path), tmp_path / "run"
    src = str(TESTS.parent / "src")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER.format(src=src, state=str(run / "state"))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        argv = ["train", "--policy-dir", str(tmp_path / "policy"), "--suites-dir", str(tmp_path / "suites")]
        argv += ["--spec-json", json.dumps(spec), "--out-dir", str(run), "--threads", "1"]
        with pytest.raises(SystemExit, match=rf"another train job writes this run folder \(pid {holder.pid} on "):
            main(argv)
        assert socket.gethostname() in (run / "state" / ".lock").read_text()
        assert not (run / "state" / "trainer.pt").exists() and not (run / "spec.json").exists()  # it wrote nothing
    finally:
        holder.kill()
        holder.wait()
    from margrpo.infra.run_lock import hold_run_folder

    with hold_run_folder(run / "state"):  # the dead holder's lock went with it
        assert f"pid {os.getpid()} " in (run / "state" / ".lock").read_text()


def test_a_run_folder_that_cannot_be_written_is_an_error_naming_it(tmp_path):
    """A run folder under a file (or one gone read-only) used to surface as the TensorBoard writer's OSError."""
    from margrpo.cli import main

    spec = train_inputs(tmp_path)
    (tmp_path / "blocked").write_text("a file where the run folder's parent should be")
    argv = ["train", "--policy-dir", str(tmp_path / "policy"), "--suites-dir", str(tmp_path / "suites")]
    with pytest.raises(SystemExit, match=r"blocked/run: the run folder cannot be made \(Not a directory\)"):
        main([*argv, "--spec-json", json.dumps(spec), "--out-dir", str(tmp_path / "blocked/run"), "--threads", "1"])


def test_a_refused_run_leaves_spec_json_as_it_was(tmp_path):
    """Issue 69: a run refused for other settings or fewer steps rewrote <run>/spec.json with settings it never ran
    under; spec.json is written once the run folder's lock is held and its state accepted."""
    from margrpo.cli import main

    spec, run = train_inputs(tmp_path), tmp_path / "run"
    argv = ["train", "--policy-dir", str(tmp_path / "policy"), "--suites-dir", str(tmp_path / "suites")]
    main([*argv, "--spec-json", json.dumps(spec), "--out-dir", str(run), "--threads", "1"])
    written = (run / "spec.json").read_bytes()
    for other in (
        {**spec, "grpo": {**spec["grpo"], "lr": spec["grpo"]["lr"] * 2}},
        {**spec, "grpo": {**spec["grpo"], "steps": 1}},
    ):
        with pytest.raises(SystemExit, match="Nothing was deleted"):
            main([*argv, "--spec-json", json.dumps(other), "--out-dir", str(run), "--threads", "1"])
        assert (run / "spec.json").read_bytes() == written
