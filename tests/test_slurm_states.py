"""Job states that end: on the test cluster (with accounting, so the plugin's default `sacct` path), a job that
SLURM ends in a state the pinned SLURM plugin keeps waiting on ends for Snakemake through `executor: margrpo-slurm`
within its patience (margrpo.infra.slurm_states): a `scancel` ("CANCELLED by 0"), a preemption by the `urgent`
partition under PreemptMode=CANCEL (PREEMPTED), a node failure of a job SLURM does not requeue (NODE_FAIL).

A one-rule workflow whose job sleeps: the states are SLURM's and the plugin's, not the trainer's. `make test-slurm`.
"""

import os
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
    resources: runtime=10, mem_mb=200, cpus_per_task=1
    shell: "sleep {config[hold]}; echo held > {output}"
"""


def start_workflow(work: Path, hold: int, retries: int) -> subprocess.Popen:
    (work / "Snakefile").write_text(SNAKEFILE)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    cmd = [SNAKEMAKE, "--executor", "margrpo-slurm", "--jobs", "1", "--retries", str(retries)]
    cmd += ["--margrpo-slurm-patience", str(PATIENCE), "--margrpo-slurm-init-seconds-before-status-checks", "2"]
    cmd += ["--margrpo-slurm-requeue", "--config", f"hold={hold}", "--directory", str(work)]
    return subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def running_job(workflow: subprocess.Popen, seconds: float = 120) -> str:
    """The id of the workflow's job once SLURM runs it."""
    deadline = time.time() + seconds
    while time.time() < deadline and workflow.poll() is None:
        out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i %j"], capture_output=True, text=True)
        jobs = [line.split()[0] for line in out.stdout.splitlines()]
        if jobs:
            return jobs[0]
        time.sleep(0.5)
    workflow.kill()
    raise AssertionError(f"no job ran within {seconds} s: {workflow.communicate()[0][-3000:]}")


def ended(workflow: subprocess.Popen, seconds: float = BOUND) -> tuple[int, str, float]:
    started = time.time()
    try:
        out, _ = workflow.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        workflow.kill()
        out = workflow.communicate()[0]
        squeue = subprocess.run(["squeue", "--states=all", "-o", "%i %T %R"], capture_output=True, text=True).stdout
        raise AssertionError(f"Snakemake still waited after {seconds} s; squeue:\n{squeue}\n{out[-3000:]}") from None
    return workflow.returncode, out, time.time() - started


def idle(node: str, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        state = subprocess.run(["sinfo", "-h", "-n", node, "-p", "debug", "-o", "%T"], capture_output=True, text=True)
        if state.stdout.strip() == "idle":
            return
        time.sleep(0.5)
    raise AssertionError(f"{node} is {state.stdout.strip()}, not idle, {seconds} s after the test")


def sacct_state(job: str) -> str:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job], capture_output=True, text=True)
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
