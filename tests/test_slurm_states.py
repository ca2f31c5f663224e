"""Job states that end: on the test cluster (with accounting, so the plugin's default `sacct` path), a job that
SLURM ends in a state the pinned SLURM plugin keeps waiting on ends for Snakemake through `executor: margrpo-slurm`
within its patience (margrpo.infra.slurm_states): a `scancel` ("CANCELLED by 0"), a preemption by the `urgent`
partition under PreemptMode=CANCEL (PREEMPTED), a node failure of a job SLURM does not requeue (NODE_FAIL). A job a
person paused (`scontrol hold`, `scontrol suspend`, `scontrol requeuehold`, its SPECIAL_EXIT form) is named in the log
after the patience and given up after the held patience; a job given up on (one of those, or one still running that
the status command stopped listing) is cancelled and seen ended before Snakemake hears it failed, so its retry never
runs beside it.

A one-rule workflow whose job sleeps: the states are SLURM's and the plugin's, not the trainer's. `make test-slurm`.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
PATIENCE = 20  # seconds in a state that ends nothing, here; the profile's default is 600
BOUND = 120  # the plugin checks every few seconds here: it reports the job within PATIENCE and two checks

SNAKEFILE = """
rule hold:
    output: "held.txt"
    resources: runtime=10, mem_mb=200, cpus_per_task=1, slurm_extra=config.get("extra", ""),
        hold=lambda wildcards, attempt: config["hold"] if attempt == 1 else 1
    shell: "sleep {resources.hold}; echo held > {output}"
"""


def start_workflow(
    work: Path, hold: int, retries: int, patience=PATIENCE, held_patience=None, extra="", path=""
) -> subprocess.Popen:
    """The one-rule workflow (a retry sleeps 1 s), its status queried 2 s after the submission and every 5 s from
    then on (the plugin alone adds 10 s to each wait, up to 180 s)."""
    (work / "Snakefile").write_text(SNAKEFILE)
    env = dict(os.environ, PATH=f"{path}{Path(sys.executable).parent}:{os.environ['PATH']}")
    cmd = [SNAKEMAKE, "--executor", "margrpo-slurm", "--jobs", "1", "--retries", str(retries)]
    cmd += ["--margrpo-slurm-patience", str(patience), "--margrpo-slurm-init-seconds-before-status-checks", "2"]
    cmd += [
        "--margrpo-slurm-held-patience",
        str(held_patience or patience),
        "--margrpo-slurm-max-status-interval",
        "5",
    ]
    cmd += ["--margrpo-slurm-requeue", "--config", f"hold={hold}", f"extra={extra}", "--directory", str(work)]
    return subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def running_job(workflow: subprocess.Popen, seconds: float = 120, state: str = "RUNNING") -> str:
    """The id of the workflow's job once SLURM runs it (or lists it in `state`)."""
    deadline = time.time() + seconds
    while time.time() < deadline and workflow.poll() is None:
        out = subprocess.run(["squeue", "-h", "-t", state, "-o", "%i %j"], capture_output=True, text=True)
        jobs = [line.split()[0] for line in out.stdout.splitlines()]
        if jobs:
            return jobs[0]
        time.sleep(0.5)
    workflow.kill()
    raise AssertionError(f"{workflow.communicate()[0][-3000:]}\nno job listed {state} within {seconds} s")


def ended(workflow: subprocess.Popen, seconds: float = BOUND) -> tuple[int, str, float]:
    started = time.time()
    try:
        out, _ = workflow.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        workflow.kill()
        out = workflow.communicate()[0]
        squeue = subprocess.run(["squeue", "--states=all", "-o", "%i %T %R"], capture_output=True, text=True).stdout
        # what the plugin's status query (sacct, by the workflow's run name, in a time window) listed
        sacct = subprocess.run(
            [
                "sacct",
                "-X",
                "-n",
                "-P",
                "-o",
                "JobIdRaw,JobName,State",
                "--starttime",
                "now-1hour",
                "--endtime",
                "now",
            ],
            capture_output=True,
            text=True,
        ).stdout
        live = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
        subprocess.run(["scancel", *live], capture_output=True)  # the session's cluster: nothing left running on it
        # the finding last: a CI excerpt shows only a message's tail
        raise AssertionError(
            f"{out[-3000:]}\nSnakemake still waited after {seconds} s; squeue:\n{squeue}sacct's window:\n{sacct}"
        ) from None
    return workflow.returncode, out, time.time() - started


def idle(node: str, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        state = subprocess.run(["sinfo", "-h", "-n", node, "-p", "debug", "-o", "%T"], capture_output=True, text=True)
        if state.stdout.strip() == "idle":
            return
        time.sleep(0.5)
    raise AssertionError(f"{node} is {state.stdout.strip()}, not idle, {seconds} s after the test")


def sacct_state(job: str, field: str = "State") -> str:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", field, "-j", job], capture_output=True, text=True)
    return out.stdout.strip()


def test_the_plugin_default_status_command_is_sacct_here(cluster):
    from snakemake_executor_plugin_slurm import _get_status_command_default

    assert _get_status_command_default() == "sacct"
    assert subprocess.run(["sacct", "-n", "-X"], capture_output=True).returncode == 0  # answered by slurmdbd


def test_a_scancelled_job_fails_for_snakemake_at_once(cluster, tmp_path):
    workflow = start_workflow(tmp_path, hold=300, retries=0)
    job = running_job(workflow)
    subprocess.run(["scancel", job], check=True)
    code, out, seconds = ended(workflow)
    assert sacct_state(job).startswith("CANCELLED by "), sacct_state(job)  # what the plugin alone waited on
    assert code == 1 and f"SLURM-job '{job}' failed, SLURM status is: 'CANCELLED'" in out, out[-3000:]


def test_a_preempted_job_is_failed_after_the_patience_and_its_retry_completes(cluster, tmp_path):
    workflow = start_workflow(tmp_path, hold=20, retries=1)
    job = running_job(workflow)
    urgent = subprocess.run(  # every CPU of both nodes, in the partition that preempts debug's jobs
        [
            "sbatch",
            "--parsable",
            "-p",
            "urgent",
            "-N2",
            "--ntasks-per-node=2",
            "--mem=100",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 5",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    code, out, seconds = ended(workflow, BOUND + 60)
    assert sacct_state(job) == "PREEMPTED" and sacct_state(urgent) == "COMPLETED", (job, urgent)
    assert f"SLURM job {job}: PREEMPTED for" in out and "reported to Snakemake as FAILED" in out, out[-3000:]
    assert code == 0 and (tmp_path / "held.txt").read_text() == "held\n", out[-3000:]  # the retry ran it


def test_a_job_lost_with_its_node_and_not_requeued_fails_after_the_patience(cluster, tmp_path):
    workflow = start_workflow(tmp_path, hold=300, retries=0)
    job = running_job(workflow)
    node = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True).stdout.strip()
    subprocess.run(["scontrol", "update", f"jobid={job}", "requeue=0"], check=True)  # as --no-requeue would
    subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=margrpo-test"], check=True)
    try:
        code, out, seconds = ended(workflow)
    finally:  # back in service (ReturnToService=2 may have done it: then scontrol refuses, and that is fine)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
        idle(node)
    assert sacct_state(job) == "NODE_FAIL", sacct_state(job)
    assert f"SLURM job {job}: NODE_FAIL for" in out and code == 1, out[-3000:]
    assert seconds >= PATIENCE, seconds  # SLURM may still have requeued it: it was waited for that long


HELD_PATIENCE = 20  # here; the profile's default is 3600: named after PATIENCE, given up after this


def given_up(out: str, job: str, what: str) -> None:
    """The log names the paused job with its remedy, then its cancel and end, before Snakemake's failure line."""
    named, ended, failed = (
        out.find(f"SLURM job {job} is {what} for"),
        out.find(f"SLURM job {job}: {what} for"),
        out.find(f"SLURM-job '{job}' failed"),
    )
    assert -1 < named < ended < failed, out[-3000:]
    assert "cancelled, and ended (CANCELLED); reported to Snakemake as FAILED" in out[ended:failed], out[-3000:]


@pytest.mark.parametrize(
    "pause, what, remedy",
    [
        (["suspend"], "SUSPENDED", "scontrol resume"),
        (["requeuehold"], "PENDING (job requeued in held state)", "scontrol release"),
        (["requeuehold", "state=specialexit"], "SPECIAL_EXIT (job requeued in held state)", "scontrol release"),
    ],
    ids=["suspend", "requeuehold", "specialexit"],
)
def test_a_paused_running_job_is_named_then_cancelled_and_fails_once_it_ended(cluster, tmp_path, pause, what, remedy):
    workflow = start_workflow(tmp_path, hold=300, retries=0, patience=10, held_patience=HELD_PATIENCE)
    job = running_job(workflow)
    subprocess.run(["scontrol", *pause, job], check=True)
    code, out, seconds = ended(workflow)
    assert code == 1 and f"`{remedy} {job}` lets it go on" in out, out[-3000:]
    given_up(out, job, what)
    assert sacct_state(job).startswith("CANCELLED"), sacct_state(job)
    # given up within its patience, SLURM's requeue (up to ~20 s here) and a few bounded queries (the plugin's
    # growing waits alone query at 2, 14, 36, 68 s: seen at 68 s at the earliest)
    assert HELD_PATIENCE <= seconds < HELD_PATIENCE + 40, seconds


def test_a_held_pending_job_is_named_then_cancelled_and_fails(cluster, tmp_path):
    """`scontrol hold` (as root: JobHeldAdmin) of the job while it waits for CPUs; sacct lists it PENDING."""
    blocker = subprocess.run(  # every CPU of both nodes, so that the workflow's job waits (Resources)
        ["sbatch", "--parsable", "-N2", "--ntasks-per-node=2", "--mem=100", "-o", "/dev/null", "--wrap", "sleep 300"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        deadline = time.time() + 60
        while sacct_state(blocker) != "RUNNING" and time.time() < deadline:
            time.sleep(0.5)
        assert sacct_state(blocker) == "RUNNING", f"the blocker {blocker} is {sacct_state(blocker)} after 60 s"
        workflow = start_workflow(tmp_path, hold=1, retries=0, patience=10, held_patience=HELD_PATIENCE)
        job = running_job(workflow, state="PENDING")
        subprocess.run(["scontrol", "hold", job], check=True)
        code, out, seconds = ended(workflow)
    finally:
        subprocess.run(["scancel", blocker])
    assert code == 1 and f"`scontrol release {job}` lets it go on" in out, f"{out[-3000:]}\nexit {code}, job {job}"
    given_up(out, job, "PENDING (JobHeldAdmin)")
    assert sacct_state(job).startswith("CANCELLED"), sacct_state(job)


def test_a_job_submitted_held_which_sacct_never_lists_is_named_then_cancelled_and_fails(cluster, tmp_path):
    """`sbatch --hold` (JobHeldUser): a job never eligible to run is left out of the plugin's sacct query (its time
    window), which would wait on it without bound; it is read from slurmctld instead."""
    workflow = start_workflow(tmp_path, hold=1, retries=0, patience=10, held_patience=HELD_PATIENCE, extra="--hold")
    job = running_job(workflow, state="PENDING")
    code, out, seconds = ended(workflow)
    assert code == 1 and f"`scontrol release {job}` lets it go on" in out, f"{out[-3000:]}\nexit {code}, job {job}"
    given_up(out, job, "PENDING (JobHeldUser)")
    assert sacct_state(job).startswith("CANCELLED"), sacct_state(job)


def test_a_running_job_the_status_command_stops_listing_is_cancelled_before_its_retry_runs(cluster, tmp_path):
    """The status command (sacct, a stand-in on PATH that leaves out the ids in `omit` and notes what it listed in
    `listed`) forgets the running job once it listed it: it is given up after the patience, cancelled, and its
    retry starts only after it ended."""
    bin_dir, omit, listed = tmp_path / "bin", tmp_path / "omit", tmp_path / "listed"
    bin_dir.mkdir()
    (tmp_path / "work").mkdir()
    omit.write_text("")
    sacct = bin_dir / "sacct"
    sacct.write_text(
        f'#!/bin/sh\nout=$({shutil.which("sacct")} "$@") || exit $?\n'
        f"printf '%s\\n' \"$out\" | grep -v -E -f {omit} | tee -a {listed} || true\n"
    )
    sacct.chmod(0o755)
    workflow = start_workflow(tmp_path / "work", hold=300, retries=1, patience=10, path=f"{bin_dir}:")
    job = running_job(workflow)
    deadline = time.time() + 90  # the plugin's first status query comes 40 s after the submission
    while f"{job}|RUNNING" not in (listed.read_text() if listed.exists() else "") and time.time() < deadline:
        time.sleep(0.5)
    omit.write_text(f"^{job}[|]\n")
    code, out, seconds = ended(workflow, BOUND + 60)
    assert code == 0 and (tmp_path / "work/held.txt").read_text() == "held\n", out[-3000:]  # the retry ran it
    assert f"SLURM job {job}: gone from the status listing for" in out, out[-3000:]
    assert "cancelled, and ended (CANCELLED)" in out, out[-3000:]
    assert sacct_state(job).startswith("CANCELLED"), sacct_state(job)
    runs = subprocess.run(
        ["sacct", "-X", "-n", "-P", "-o", "JobIdRaw,Start,End", "-S", "now-1hour"], capture_output=True, text=True
    ).stdout.split()
    times = {run.split("|")[0]: run.split("|")[1:] for run in runs}
    retry = max(times, key=int)
    assert int(retry) > int(job) and times[retry][0] >= times[job][1], times  # started after the first one ended
