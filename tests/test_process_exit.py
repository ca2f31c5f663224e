"""Issue 81: a data-parallel process that did its work never aborts at exit. The cause: a process group that
outlives the process's last Python line keeps gloo's threads running into the interpreter's exit, and one that
then needs the GIL (to drop the Python callback of a finished collective, such as DDP's communication hook's) is
ended by the exiting interpreter: "terminate called without an active exception" (in a C++ destructor) or "Fatal
Python error: _PyThreadState_DeleteCurrent", exit 134. `leave_process_group` (margrpo.infra.process_group) destroys
every group, with what held it past `destroy_process_group` (DDP's reducer, FSDP's device mesh), so that no
backend thread is left at exit: at the end of a run, after a stop, and after an error (its exit handler)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
SRC = TESTS.parent / "src"


def launch(script: Path, *args: str, **env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "margrpo.infra.launch", "2", sys.executable, str(script), *args]
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)]), **env}
    return subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=300)


def test_a_gloo_thread_that_needs_the_gil_at_exit_aborts_the_process_unless_the_group_was_left():
    """The mechanism, made certain: the collective's callback is still running when the main thread ends."""
    left_running = launch(TESTS / "exit_worker.py")
    assert left_running.returncode == 134, left_running.stderr[-2000:]
    # either way the thread meets the exiting interpreter: its C++ frames, or Python's own check
    aborts = ("terminate called without an active exception", "Fatal Python error: _PyThreadState_DeleteCurrent")
    assert any(abort in left_running.stderr for abort in aborts), left_running.stderr[-2000:]
    left = launch(TESTS / "exit_worker.py", LEAVE="1")
    assert left.returncode == 0 and "terminate called" not in left.stderr, left.stderr[-2000:]


def first_update(out: Path, sharding: str, **env) -> tuple[subprocess.CompletedProcess, list]:
    """The bf16 first update of tests/test_data_parallel.py (two processes), and the process-group threads each
    process still ran at exit."""
    out.mkdir(parents=True)
    run = launch(
        TESTS / "dp_worker.py",
        "first-update",
        str(out),
        SHARDING=sharding,
        PRECISION="bf16",
        ONLY="grpo,fix",
        THREADS_AT_EXIT=str(out),
        **env,
    )
    threads = [json.loads(p.read_text()) for p in sorted(out.glob("threads-rank*.json"))]
    return run, threads


@pytest.mark.parametrize("sharding", ["replicate", "full_shard"])
def test_no_process_group_thread_outlives_a_process_that_failed(tmp_path, sharding):
    run, threads = first_update(tmp_path / "out", sharding, FAIL_AT_END="1")
    assert run.returncode == 1 and "FAIL_AT_END" in run.stderr, run.stderr[-3000:]  # the error's code, not 134
    assert threads == [[], []]


@pytest.mark.slow
def test_the_bf16_first_updates_never_abort_at_exit_beside_cpu_hogs(tmp_path):
    """The case of the issue (tests/test_data_parallel.py's bf16 test, process 1 exited 134 in a loaded `make
    test`) three times a sharding beside two busy processes; each process leaves no backend thread at exit."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for attempt in range(3):
            for sharding in ("replicate", "full_shard"):
                run, threads = first_update(tmp_path / f"{sharding}-{attempt}", sharding)
                assert run.returncode == 0 and "terminate called" not in run.stderr, run.stderr[-3000:]
                assert threads == [[], []], (sharding, attempt)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
