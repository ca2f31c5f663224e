"""`python -m margrpo.infra.launch [--nodes M --port P] N COMMAND...`: COMMAND as N data-parallel processes per node.

One node (`--nodes 1`, the default): the processes of one machine, reachable from it alone (below).
Several nodes: torchrun itself, started once per node by `srun` inside a SLURM job of M nodes, with a c10d
rendezvous on the job's first node at port P (`auto`: derived from the job id; the port must be open between the
nodes; the processes' NCCL / gloo sockets use ports the OS picks). Outside SLURM, start torchrun on each node yourself
with the same flags (`multi_node_command` prints them). Nothing else is ours: torchrun restarts nothing
(`--max-restarts 0`), and its exit code is the job's.

The single-node job torchrun starts, with its environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
but not listening on the network. torchrun's flags cannot do that: torch's TCPStore binds the wildcard address
whatever host it is given (docs/findings.md, "torchrun listens on every address"). Here the store runs on a socket
this launcher binds to 127.0.0.1 (TCPStore's `master_listen_fd`), every process joins it as a client
(torchelastic's agent-store protocol), and gloo and NCCL open their sockets on the loopback device. The first
process to fail stops the others; the launcher names it and exits with its code.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta

LOOPBACK = "127.0.0.1"


def worker_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "GROUP_RANK": "0",
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": LOOPBACK,
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "lo",
    }


def launch(world: int, command: list[str]) -> int:
    """Run `command` as `world` processes around a store on the loopback interface; the first failing code, else 0."""
    import torch.distributed as dist

    listener = socket.create_server((LOOPBACK, 0))
    port = listener.getsockname()[1]
    store = dist.TCPStore(  # noqa: F841 (kept alive until the processes end)
        LOOPBACK,
        port,
        world_size=world,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(minutes=30),
        master_listen_fd=listener.fileno(),
    )
    print(f"margrpo.infra.launch: on {socket.gethostname()}: {world} processes", file=sys.stderr, flush=True)
    procs = [subprocess.Popen(command, env=worker_env(rank, world, port)) for rank in range(world)]
    for sig in (signal.SIGINT, signal.SIGTERM):  # Snakemake stops a job with SIGTERM: pass it on
        signal.signal(sig, lambda s, _: [p.send_signal(s) for p in procs if p.poll() is None])
    failed = first_failure(procs)
    if failed:
        rank, code = failed
        print(
            f"margrpo.infra.launch: process {rank} of {world} exited with code {code}; stopping the others",
            file=sys.stderr,
            flush=True,
        )
    for p in procs:  # one failed: the others would wait for it in a collective forever
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return failed[1] if failed else 0


def first_failure(procs: list[subprocess.Popen]) -> tuple[int, int] | None:
    """Wait for the processes in the order they end: the rank and exit code of the first to fail, or None when
    all succeed.

    The kernel's order, not a poll: when one process dies, its peers die of the broken connection moments
    later, and a poll that sees both at once could report a peer's code instead of the cause's.
    """
    running = {p.pid: p for p in procs}
    while running:
        pid, status = os.waitpid(-1, 0)
        if (p := running.pop(pid, None)) is None:
            continue
        p.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        if p.returncode:  # a signal -N as a shell reports it, 128 + N
            return procs.index(p), p.returncode if p.returncode > 0 else 128 - p.returncode
    return None


def multi_node_command(nodes: int, per_node: int, endpoint: str, run_id: str, command: list[str]) -> list[str]:
    """torchrun (`python -m torch.distributed.run`) for one node of an M-node job, its rendezvous at `endpoint`."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        "--max-restarts=0",
        "--no-python",  # COMMAND is a program (`margrpo`), as for the single-node launcher, not a Python script
        *command,
    ]


def launch_slurm(nodes: int, per_node: int, port: int | str, command: list[str]) -> int:
    """srun starts torchrun once on each of the job's nodes; the first node hosts the rendezvous, at the address
    SLURM knows it by and a port of this job's own (`infra.slurm`)."""
    from margrpo.infra.slurm import job_nodes, node_address, rendezvous_port

    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise SystemExit(
            f"margrpo.infra.launch: --nodes {nodes} runs inside a SLURM job of {nodes} nodes "
            "(SLURM_JOB_ID is unset); elsewhere run on each node: "
            + " ".join(multi_node_command(nodes, per_node, "FIRST_NODE:PORT", "RUN_ID", command))
        )
    hosts = job_nodes(job_id)
    if len(hosts) != nodes:
        raise SystemExit(f"margrpo.infra.launch: --nodes {nodes}, but SLURM job {job_id} holds {len(hosts)}: {hosts}")
    port = rendezvous_port(job_id) if port == "auto" else int(port)
    endpoint = f"{node_address(hosts[0])}:{port}"
    torchrun = multi_node_command(nodes, per_node, endpoint, job_id, command)
    srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    print(
        f"margrpo.infra.launch: on {socket.gethostname()}, job {job_id}: {' '.join(srun + torchrun)}",
        file=sys.stderr,
        flush=True,
    )
    return subprocess.run(srun + torchrun).returncode


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m margrpo.infra.launch", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1, help="nodes of the job (> 1: under SLURM, torchrun on each)")
    parser.add_argument(
        "--port", default="auto", help="the rendezvous port on the first node (--nodes > 1); auto: from the job id"
    )
    parser.add_argument("processes", type=int, help="processes per node (one GPU each on cuda)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.processes < 1 or args.nodes < 1 or not args.command:
        parser.error("N >= 1 processes, --nodes >= 1 and a COMMAND are needed")
    if args.port != "auto" and not (args.port.isdigit() and 1024 <= int(args.port) <= 65535):
        parser.error(f"--port {args.port}: expected auto or a port in 1024-65535")
    if args.nodes > 1:
        return launch_slurm(args.nodes, args.processes, args.port, args.command)
    return launch(args.processes, args.command)


if __name__ == "__main__":
    sys.exit(main())
