"""How a job stops (issue 70, docs/real-scale.md "How a job stops"): one request is one request however many copies
of its signal arrive; the handlers cover a process's whole life; what follows a saved stop inside SLURM is chosen
from the job's state (a planned stop requeues, a `scancel` does not, and a retry does not undo it); each segment of
a job heads its part of the appended log."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from margrpo.infra import slurm, stopping

REPO = Path(__file__).resolve().parents[1]
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


@pytest.fixture
def handlers():
    """The test process's signal handlers, put back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_one_ctrl_c_that_arrives_twice_is_one_request_and_a_later_one_interrupts(handlers, monkeypatch):
    """Ctrl-C reaches a worker from the terminal and from the launcher (`scancel --signal=INT` from slurmd and srun)
    within milliseconds: a save, not KeyboardInterrupt. Pressed again once REPEAT_S has passed, it interrupts."""
    stop = stopping.StopRequest(read_limit=False)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the forwarded copy
        except KeyboardInterrupt:
            pytest.fail("the forwarded copy of one Ctrl-C was read as a second one: no save")
        assert stop.reason(0.0) == "SIGINT received"
        monkeypatch.setattr(stopping, "REPEAT_S", 0.05)
        time.sleep(0.1)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.close()


def test_a_sigterm_after_a_sigint_keeps_the_first_signal_and_counts_no_second_ctrl_c(handlers):
    stop = stopping.StopRequest(read_limit=False)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # srun's copy
        assert stop.signalled == "SIGINT" and "saved" in stop.since_signal()
    finally:
        stop.close()


class Killed(Exception):
    """The default action of a stop signal where no handler of ours was installed yet (exit 143 for a process)."""


def _fatal(signum, _frame):
    raise Killed(signal.Signals(signum).name)


def test_the_launcher_passes_a_signal_that_comes_while_it_starts_its_processes_to_each(handlers, monkeypatch):
    """A SIGTERM while the launcher starts its processes: it neither ends the launcher nor misses the processes
    started after it."""
    from margrpo.infra import launch

    for sig in STOP_SIGNALS:
        signal.signal(sig, _fatal)
    popen, started = subprocess.Popen, []

    def start(command, env):
        started.append(popen(command, env=env))
        if len(started) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # SLURM's stop, between the first process and the second
        return started[-1]

    monkeypatch.setattr(launch.subprocess, "Popen", start)
    code = launch.launch(2, [sys.executable, "-c", "import time; time.sleep(60)"])
    assert [p.returncode for p in started] == [-signal.SIGTERM, -signal.SIGTERM] and code == 128 + signal.SIGTERM


def test_a_sigterm_while_the_model_is_built_saves_and_exits_resumable(tmp_path, handlers, monkeypatch):
    """The stop's handlers are there before the model is built (minutes at real scale): a preemption then ends the
    stage with status 75, not the process with 143."""
    from helpers import train_inputs

    from margrpo.cli import main
    from margrpo.grpo import parallel

    spec = train_inputs(tmp_path)
    for sig in STOP_SIGNALS:
        signal.signal(sig, _fatal)
    build = parallel.build_policy

    def build_then_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return build(*args, **kwargs)

    monkeypatch.setattr(parallel, "build_policy", build_then_signal)
    argv = ["train", "--policy-dir", str(tmp_path / "policy"), "--suites-dir", str(tmp_path / "suites")]
    argv += ["--spec-json", json.dumps(spec), "--out-dir", str(tmp_path / "run"), "--threads", "1"]
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == stopping.EXIT_RESUMABLE


class FakeSlurm:
    """scontrol and sacct as a job sees them while SLURM ends it: scontrol says COMPLETING, sacct the base state."""

    def __init__(self, monkeypatch, state: str, sacct: str = "", restarts: int = 0):
        self.record = {"JobState": state, "Restarts": str(restarts), "JobName": "run-uuid-1"}
        self.calls = []
        monkeypatch.setenv("SLURM_JOB_ID", "42")
        monkeypatch.setattr(slurm, "job_record", lambda job_id=None: self.record)
        monkeypatch.setattr(slurm, "_scontrol", lambda *args: self.calls.append(args) or "")
        real_run = subprocess.run

        def run(cmd, *args, **kwargs):
            if cmd[0] == "sacct":
                return subprocess.CompletedProcess(cmd, 0, stdout=sacct + "\n", stderr="")
            return real_run(cmd, *args, **kwargs)

        monkeypatch.setattr(slurm.subprocess, "run", run)


@pytest.mark.parametrize(
    "state, sacct, then, requeued",
    [
        ("RUNNING", "", "requeued", True),  # the warning signal, the end-time watch, `scancel --signal`
        ("COMPLETING", "PREEMPTED", "requeued", True),  # PreemptMode=CANCEL: SLURM requeues a completing job
        ("COMPLETING", "TIMEOUT", "ended", False),  # the limit came first: Snakemake sees TIMEOUT, a retry resumes
        ("COMPLETING", "REQUEUED", "ended", False),  # SLURM requeues it itself (PreemptMode=REQUEUE, scontrol)
        ("COMPLETING", "CANCELLED by 0", "cancelled", False),  # a person's, an admin's or Snakemake's scancel
    ],
)
def test_what_follows_a_saved_stop_is_chosen_from_the_jobs_state(tmp_path, monkeypatch, state, sacct, then, requeued):
    fake = FakeSlurm(monkeypatch, state, sacct)
    assert slurm.after_stop(20, tmp_path, 7) == then
    assert (fake.calls == [("requeue", "42")]) is requeued
    assert (tmp_path / slurm.CANCELLED_NOTE).exists() is (then == "cancelled")
    assert slurm.after_stop(0, tmp_path, 7) in ("ended", "cancelled")  # slurm.requeues: 0 never requeues


def test_a_cancelled_job_is_not_undone_by_a_retry_but_goes_on_in_the_next_snakemake_run(tmp_path, monkeypatch, caplog):
    fake = FakeSlurm(monkeypatch, "COMPLETING", "CANCELLED by 0")
    assert slurm.after_stop(20, tmp_path, 7) == "cancelled"
    assert "was cancelled" in caplog.text and "run snakemake again to go on" in caplog.text
    with pytest.raises(SystemExit, match=r"SLURM job 42 of this Snakemake run was cancelled .* run snakemake again"):
        slurm.refuse_cancelled_retry(tmp_path, remove=True)  # the retry: the same job name (the plugin's run id)
    fake.record["JobName"] = "run-uuid-2"  # the next `snakemake`
    slurm.refuse_cancelled_retry(tmp_path, remove=True)
    assert not (tmp_path / slurm.CANCELLED_NOTE).exists()


def test_each_segment_of_a_job_heads_its_part_of_the_appended_log(monkeypatch):
    FakeSlurm(monkeypatch, "RUNNING", restarts=3)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)  # the jobstep plugin strips it
    assert re.search(r"^==== \d{4}-\d\d-\d\d \d\d:\d\d:\d\d: SLURM job 42, restart 3, on ", slurm.segment_header())
    # Snakemake deletes a job's log before each run: the segments are appended beside it, the log is their copy
    for rules in ("train.smk", "related.smk"):  # GRPO's train rule and the related methods'
        shell = (REPO / "workflow/rules" / rules).read_text()
        assert ">> {params.segments:q} 2>&1" in shell and "cp {params.segments:q} {log:q}" in shell, rules


def test_a_requeue_is_the_default_at_real_scale_and_the_profiles_retries_are_for_failures():
    import yaml

    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    assert schema["properties"]["slurm"]["properties"]["requeues"]["default"] >= 20
    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    assert profile["retries"] == 1 and "--signal=TERM@300" in profile["default-resources"]["slurm_extra"]


def test_the_end_time_estimate_counts_the_next_steps_validation_and_a_save(monkeypatch):
    """A step takes 1 s, a validation 5 s, a save 2 s (a clock of the test's own). The stop is asked before each
    step with what the next one costs: the step, its validation where it has one (the base validation's time
    before any step's), and a save (a step's time before the first save)."""
    from margrpo.grpo import run_loop
    from margrpo.grpo.run_files import RunState

    clock = [0.0]
    monkeypatch.setattr(run_loop.time, "monotonic", lambda: clock[0])
    asked = []

    class Method:
        state_dir = None

        def train_step(self):
            clock[0] += 1.0
            state.step += 1
            return {"step": state.step}

        def validate(self):
            clock[0] += 5.0
            return [1.0]

        def save(self, background=False):
            clock[0] += 2.0

        def finish_saves(self, wait=True):
            pass

        def log(self, row):
            pass

        def should_stop(self, next_seconds):
            asked.append(next_seconds)

    state = RunState()
    run_loop.run_loop(Method(), state, run_loop.Cadence(steps=4, val_every=2, save_every=3), "test", show=False)
    # before step 2 (validated; no save yet): 1 + 5 + 1; before 3 (saved there): 1 + 0 + 1; before 4: 1 + 5 + 2
    assert asked == [7.0, 2.0, 8.0], asked


def test_without_accounting_scontrol_tells_a_preemption_and_a_time_limit(monkeypatch):
    fake = FakeSlurm(monkeypatch, "COMPLETING")

    def no_sacct(cmd, *args, **kwargs):
        raise FileNotFoundError(cmd[0])

    monkeypatch.setattr(slurm.subprocess, "run", no_sacct)
    fake.record.update(PreemptTime="2026-12-03T20:15:00", Reason="None")
    assert slurm.ending_state("42") == "PREEMPTED"
    fake.record.update(PreemptTime="None", Reason="TimeLimit")
    assert slurm.ending_state("42") == "TIMEOUT"
    fake.record.update(Reason="None")  # a scancel: not told apart without accounting; not noted, not requeued
    assert slurm.ending_state("42") == "COMPLETING"


def test_a_job_the_executor_gave_up_on_ends_resumable_and_its_retry_goes_on(tmp_path, monkeypatch):
    """margrpo-slurm's own scancel (a job it gave up on, marked in its Comment first) is not a person's: no note,
    so the retry it submits resumes the run instead of stopping."""
    fake = FakeSlurm(monkeypatch, "COMPLETING", "CANCELLED by 0")
    fake.record["Comment"] = slurm.GIVEN_UP
    assert slurm.after_stop(20, tmp_path, 7) == "ended"
    assert not (tmp_path / slurm.CANCELLED_NOTE).exists() and fake.calls == []
    slurm.refuse_cancelled_retry(tmp_path, remove=True)  # the retry goes on


def test_the_executor_marks_a_job_it_gives_up_on_before_its_scancel(monkeypatch):
    calls = []
    monkeypatch.setattr(slurm.subprocess, "run", lambda cmd, **kwargs: calls.append(cmd))
    slurm.mark_given_up(["42", "43"])
    assert calls == [["scontrol", "update", f"JobId={j}", f"Comment={slurm.GIVEN_UP}"] for j in ("42", "43")]
