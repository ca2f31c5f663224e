"""What a GRPO training job asks SLURM for, and what it reads back from SLURM once it runs.

The geometry (docs/real-scale.md, "SLURM"), as snakemake-executor-plugin-slurm 2.8 turns a rule's resources into
an `sbatch` line:
- one process: one node, one task; `gpu: 1` where GPUs are asked for;
- N processes on one node: one node, one task (the launcher starts the N processes itself), N GPUs. The plugin
  adds `--ntasks-per-gpu` to a GPU job that names `tasks`, and some of its versions did so unasked: that would run
  the rule's command once per GPU, so `tasks_per_gpu: 0` says no;
- N processes on each of M nodes: M nodes, M tasks (one torchrun a node), `--gres=gpu:N` (GRES count per node).
  The `mpi` resource makes the jobstep plugin run the rule's command in the batch script, not in a one-task step
  that would hold the first node's CPUs while our `srun` waits for them.
In every case the task gets `cpus_per_task` = processes x `threads`: each process's torch threads on a CPU of its
own where the cluster binds tasks to CPUs.

Inside the job the jobstep plugin strips the SLURM_* variables but the job id, so the nodes, the head node's
address, the CPUs each task holds and the job's end time are asked of `scontrol`.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

log = logging.getLogger(__name__)
PORT_BASE, PORT_SPAN = 20000, 10000  # below Linux's ephemeral range (32768-60999): no client socket holds them


@dataclass(frozen=True)
class TrainJob:
    """A GRPO job's command prefix (`margrpo` or a launcher) and its Snakemake resources."""

    launch: str
    resources: dict


def train_job(processes: int, nodes: int, gpus: bool, port: int | str = "auto", threads: int = 1) -> TrainJob:
    """The launcher and resources of a GRPO job of `processes` per node on `nodes` nodes (one GPU a process when
    `gpus`, `threads` torch threads a process)."""
    cpus = {"cpus_per_task": processes * threads}  # the launcher and torchrun wait on their processes: no more
    # the jobstep plugin strips SLURM_CONF from the job's command; where a site sets it, scontrol and srun need it
    conf = f"SLURM_CONF={shlex.quote(os.environ['SLURM_CONF'])} " if os.environ.get("SLURM_CONF") else ""
    if nodes > 1:
        launch = f"{conf}python -m margrpo.infra.launch --nodes {nodes} --port {port} {processes} margrpo"
        resources = {"nodes": nodes, "tasks": nodes, "mpi": "srun", "tasks_per_gpu": 0, **cpus}
        return TrainJob(launch, {**resources, **({"gres": f"gpu:{processes}"} if gpus else {})})
    launch = "margrpo" if processes == 1 else f"python -m margrpo.infra.launch {processes} margrpo"
    return TrainJob(conf + launch, {"nodes": 1, "tasks_per_gpu": 0, "gpu": processes if gpus else 0, **cpus})


def rendezvous_port(job_id: str | None) -> int:
    """The first port a job tries on its head node (`infra.launch` steps on from it while it is taken)."""
    if not job_id or not job_id.split("_")[0].isdigit():
        return PORT_BASE
    return PORT_BASE + int(job_id.split("_")[0]) % PORT_SPAN


class SlurmCommandMissing(FileNotFoundError):
    """A SLURM command that is not on PATH: an OSError, which every caller that tolerates a failed SLURM call
    catches already, with a one-line message naming the command."""


def missing_command_message(command: str) -> str:
    return f"{command}: not on PATH (SLURM's commands are on a cluster's nodes, not installed by `make install`)"


def run_slurm(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of a SLURM command; an absent binary raises SlurmCommandMissing, not a bare ENOENT."""
    try:
        return subprocess.run(command, **kwargs)
    except FileNotFoundError as err:
        if err.filename not in (None, command[0]):  # the working directory, not the command
            raise
        raise SlurmCommandMissing(missing_command_message(command[0])) from None


def _scontrol(*args: str) -> str:
    return run_slurm(["scontrol", *args], capture_output=True, text=True, check=True).stdout


def _fields(record: str) -> dict[str, str]:
    """`scontrol show ... -o`'s Key=Value words (values without spaces: the ones read here)."""
    return dict(word.split("=", 1) for word in record.split() if "=" in word)


def job_record(job_id: str | None = None) -> dict[str, str]:
    """`scontrol show job -o` of this job (or `job_id`)."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise RuntimeError("not inside a SLURM job: SLURM_JOB_ID is unset")
    return _fields(_scontrol("show", "job", "-o", job_id))


def job_nodes(record: dict[str, str]) -> list[str]:
    """The host names of a job's nodes, first node first."""
    return _scontrol("show", "hostnames", record["NodeList"]).split()


def cpus_per_task(record: dict[str, str]) -> int | None:
    """The CPUs each task of the job holds (`CPUs/Task`), which a step inside the job must ask for again: since
    SLURM 22.05 `srun` does not inherit the job's `--cpus-per-task`."""
    value = record.get("CPUs/Task", "")
    return int(value) if value.isdigit() else None


def node_address(node: str, peer: str | None = None) -> str:
    """The address the other nodes reach `node` at, asked on `node` itself (the launcher on the batch host, each
    node agent on its own node). SLURM's NodeAddr where it is an address (IPv4 or IPv6). Where it is a name
    (NodeAddr equals NodeName where a site leaves it unset), what that name resolves to here, unless only to
    loopback (Debian's hosts file maps a machine's own name to 127.0.1.1): then the address this machine's route
    to `peer` (another node's address) leaves from. Resolved once, so every process of the node is given the same
    address."""
    try:
        addr = _fields(_scontrol("show", "node", "-o", node)).get("NodeAddr") or node
    except (OSError, subprocess.CalledProcessError):
        addr = node
    if _is_ip(addr):
        return addr
    try:
        resolved = sorted({info[4][0] for info in socket.getaddrinfo(addr, None, socket.AF_INET)})
    except socket.gaierror:
        resolved = []
    routable = [a for a in resolved if not ipaddress.ip_address(a).is_loopback]
    if routable:
        return routable[0]
    if peer:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # a route lookup: no packet is sent
            probe.connect((peer, 9))
            return probe.getsockname()[0]
    raise RuntimeError(
        f"SLURM node {node}: NodeAddr {addr} resolves to {resolved or 'nothing'} here, and no other node's address "
        "is known to find this node's own by its route"
    )


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def job_end_time(job_id: str | None = None) -> float | None:
    """When SLURM ends this job (its time limit, its own or the partition's; seconds since the epoch); None outside
    SLURM, without a limit (EndTime Unknown) or where `scontrol` cannot say. Inside a job it logs the limit it read,
    or why it has none: a run that will not save before its limit says so."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return None
    try:
        end = job_record(job_id).get("EndTime", "(none in scontrol's record)")
    except (RuntimeError, OSError, subprocess.CalledProcessError) as err:
        log.warning("SLURM job %s: its time limit cannot be read (%s); the run will not save before it", job_id, err)
        return None
    try:  # SLURM writes local time without a zone
        at = datetime.fromisoformat(end).timestamp()
    except ValueError:
        log.warning("SLURM job %s: no time limit (EndTime %s); the run will not save before one", job_id, end)
        return None
    log.info("SLURM job %s ends at %s (%.0f s from now)", job_id, end, at - time.time())
    return at


def requeue(limit: int, job_id: str | None = None, ending: bool = False) -> bool:
    """Put this job back in SLURM's queue under its own id: a planned stop (a time limit, a warning signal, a
    preemption) that whoever waits on the job (Snakemake) sees as a job still to run, costing none of its retries.
    At most `limit` times a job (its `Restarts`); False outside SLURM, past the limit, or where `scontrol`
    refuses (then the job ends resumable, status 75, and a retry runs it again). A job SLURM is ending already is
    requeued only when told so (`ending`: a preemption under PreemptMode=CANCEL; SLURM requeues a job that is
    completing)."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    if not job_id or limit <= 0:
        return False
    try:
        record = job_record(job_id)
        restarts = int(record.get("Restarts", "0"))
        if record.get("JobState") != "RUNNING" and not ending:  # SLURM ends it already (a requeue, scancel, ...)
            log.warning("SLURM job %s is %s: not requeued by the run", job_id, record.get("JobState"))
            return False
        if restarts >= limit:
            log.warning(
                "SLURM job %s: requeued %d times already (slurm.requeues: %d); not again", job_id, restarts, limit
            )
            return False
        _scontrol("requeue", job_id)
    except (RuntimeError, OSError, ValueError, subprocess.CalledProcessError) as err:
        why = err.stderr.strip() if isinstance(err, subprocess.CalledProcessError) and err.stderr else err
        if ending and "pending" in str(why).lower():  # PreemptMode=REQUEUE: SLURM requeued it first
            log.warning("SLURM job %s: requeued by SLURM (%s); it runs again under its id", job_id, why)
            return True
        log.warning("SLURM job %s: cannot requeue it (%s); ending resumable instead", job_id, why)
        return False
    log.warning(
        "SLURM job %s requeued (%d of at most %d): it runs again under its id and resumes", job_id, restarts + 1, limit
    )
    return True


def ending_state(job_id: str, wait_s: float = 10.0) -> str:
    """The job's state as SLURM ends it: RUNNING while nothing ends it (a signal alone: the warning signal,
    `scancel --signal`, a preemption's grace time); else why it ends. `scontrol` shows every job being ended as
    COMPLETING; accounting keeps the base state SLURM decided (CANCELLED, TIMEOUT, PREEMPTED, REQUEUED, ...), so
    sacct is asked then (for up to `wait_s` while its record still says RUNNING). Without accounting, scontrol's
    PreemptTime and Reason tell a preemption and a time limit; "" where SLURM cannot say."""
    try:
        record = job_record(job_id)
    except (RuntimeError, OSError, subprocess.CalledProcessError):
        return ""
    state = record.get("JobState", "")
    if state != "COMPLETING":
        return state
    deadline = time.time() + wait_s
    while True:
        try:
            sacct = ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State"]
            out = run_slurm(sacct, capture_output=True, text=True, check=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            break
        words = [w for w in out.split() if w.isupper()]  # "CANCELLED by 0": the state word; the last: this segment
        if words and words[-1] not in ("RUNNING", "PENDING"):
            return words[-1]
        if time.time() > deadline:
            break
        time.sleep(1.0)
    if record.get("PreemptTime", "None") not in ("None", "Unknown"):
        return "PREEMPTED"
    return "TIMEOUT" if record.get("Reason") == "TimeLimit" else state


# a deliberate stop (`scancel` by a person or an admin, Snakemake's own on Ctrl-C): the run folder's note of it, so
# that a retry within the same Snakemake run (the profile's `retries`) does not undo it
CANCELLED_NOTE = "cancelled.json"
GIVEN_UP = "margrpo-slurm-gave-up"  # the Comment margrpo-slurm sets on a job it gives up on, before its scancel


def mark_given_up(jobs: list[str]) -> None:
    """Tell a job the executor cancels from a person's `scancel` (its Comment): the job then ends resumable, and the
    retry Snakemake submits next resumes it. A failed mark leaves a plain scancel (the retry stops, naming it)."""
    for job in jobs:
        command = ["scontrol", "update", f"JobId={job}", f"Comment={GIVEN_UP}"]
        try:
            run_slurm(command, capture_output=True, check=False)
        except OSError as err:
            log.warning("SLURM jobs %s: not marked as given up (%s); a plain scancel follows", ", ".join(jobs), err)
            return


def given_up(job_id: str) -> bool:
    """Whether margrpo-slurm gave this job up (`mark_given_up`) before it was cancelled."""
    try:
        return job_record(job_id).get("Comment") == GIVEN_UP
    except (RuntimeError, OSError, subprocess.CalledProcessError):
        return False


def after_stop(limit: int, run_dir: Path, step: int, job_id: str | None = None) -> str:
    """What the main process does once a stopped run saved, inside SLURM (docs/real-scale.md, "How a job
    stops"), by the job's state now: "requeued" (it waits for SLURM to end the job, which runs again under its
    id), "cancelled" (a deliberate stop: noted in the run folder, not requeued; the log's last line says how to
    go on) or "ended" (exit resumable: SLURM requeues the job itself, or ended it by its time limit and a retry
    resumes it; outside SLURM, the same command)."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return "ended"
    state = ending_state(job_id)
    if state == "CANCELLED" and given_up(job_id):  # the executor's scancel before a retry: that retry resumes it
        log.warning("SLURM job %s was given up on by margrpo-slurm, not stopped by a person: ending resumable", job_id)
        return "ended"
    if state == "CANCELLED":
        note = {"job": job_id, "job_name": _job_name(job_id), "step": step, "at": time.strftime("%Y-%m-%d %H:%M:%S")}
        (run_dir / CANCELLED_NOTE).write_text(json.dumps(note) + "\n")
        log.error(
            "SLURM job %s was cancelled (scancel, or Snakemake stopped): not requeued; its state is saved at step "
            "%d: run snakemake again to go on",
            job_id,
            step,
        )
        return "cancelled"
    if state in ("RUNNING", "PREEMPTED"):  # planned: a warning, the end-time watch, a preemption
        return "requeued" if requeue(limit, job_id, ending=state == "PREEMPTED") else "ended"
    log.warning("SLURM job %s is %s: ending resumable", job_id, state or "in a state SLURM does not say")
    return "ended"


def refuse_cancelled_retry(run_dir: Path, remove: bool) -> None:
    """Stop a retry of a cancelled job (SystemExit naming it): the note of a `scancel` in this run folder, made in
    this Snakemake run (the SLURM plugin names every job of a run alike: the job name). A note of an earlier run
    (a new `snakemake`, or a run by hand) goes (`remove`: the main process) and the run resumes."""
    path = run_dir / CANCELLED_NOTE
    try:
        note = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    job_id = os.environ.get("SLURM_JOB_ID")
    if job_id and note.get("job_name") and _job_name(job_id) == note["job_name"]:
        raise SystemExit(
            f"margrpo train: SLURM job {note.get('job')} of this Snakemake run was cancelled at {note.get('at')} "
            f"(its state saved at step {note.get('step')}); a retry does not undo that: run snakemake again to go on"
        )
    if remove:
        path.unlink(missing_ok=True)


def _job_name(job_id: str) -> str | None:
    try:
        return job_record(job_id).get("JobName")
    except (RuntimeError, OSError, subprocess.CalledProcessError):
        return None


def segment_header() -> str:
    """The line that heads one job's part of a log the rule appends to (retries and requeues keep the earlier
    parts): the job id, how often SLURM restarted it (its requeues) and the time."""
    when, host = time.strftime("%Y-%m-%d %H:%M:%S"), socket.gethostname()
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return f"==== {when}: started on {host} (pid {os.getpid()}) ===="
    restarts = os.environ.get("SLURM_RESTART_COUNT")  # the jobstep plugin strips it: then scontrol's Restarts
    if restarts is None:
        try:
            restarts = job_record(job).get("Restarts", "?")
        except (RuntimeError, OSError, subprocess.CalledProcessError):
            restarts = "?"
    return f"==== {when}: SLURM job {job}, restart {restarts}, on {host} ===="


def wait_to_be_ended(seconds: float = 600.0) -> None:
    """After `requeue`: SLURM ends the running job (SIGTERM, then SIGKILL after its KillWait) and starts it again;
    wait for that rather than exit, so that no launcher or plugin above reads an exit status as a failure. Back
    after `seconds` only if SLURM never came (the caller then exits resumable)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # SLURM's end: the default action, no save to make
    deadline = time.time() + seconds
    while time.time() < deadline:
        time.sleep(1.0)
    log.warning("requeued, but SLURM did not end the job within %.0f s; exiting resumable", seconds)


def seconds_left(end_time: float | None) -> float:
    return float("inf") if end_time is None else end_time - time.time()
