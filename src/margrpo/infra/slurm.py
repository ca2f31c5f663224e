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
import logging
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime

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


def _scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, check=True).stdout


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


def requeue(limit: int, job_id: str | None = None) -> bool:
    """Put this job back in SLURM's queue under its own id: a planned stop (a time limit, a warning signal, a
    preemption) that whoever waits on the job (Snakemake) sees as a job still to run, costing none of its retries.
    At most `limit` times a job (its `Restarts`); False outside SLURM, past the limit, or where `scontrol`
    refuses (then the job ends resumable, status 75, and a retry runs it again)."""
    job_id = job_id or os.environ.get("SLURM_JOB_ID")
    if not job_id or limit <= 0:
        return False
    try:
        record = job_record(job_id)
        restarts = int(record.get("Restarts", "0"))
        if record.get("JobState") != "RUNNING":  # SLURM ends it already (a requeue, a preemption, scancel)
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
        log.warning("SLURM job %s: cannot requeue it (%s); ending resumable instead", job_id, why)
        return False
    log.warning(
        "SLURM job %s requeued (%d of at most %d): it runs again under its id and resumes", job_id, restarts + 1, limit
    )
    return True


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
