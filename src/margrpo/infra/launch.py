"""`python -m margrpo.infra.launch [--nodes M --port P] N COMMAND...`: COMMAND as N data-parallel processes per node.

One node (`--nodes 1`, the default): the processes of one machine, reachable from it alone (below).
Several nodes (inside a SLURM job of M nodes, from its batch script on its BatchHost): this launcher holds the
rendezvous port on that node's address (`auto`: from the job id, stepping past ports other jobs hold) and hosts
the c10d store there; `srun` starts a node agent once per node with the job's CPUs per task, which becomes torchrun,
a client of that store, reached by the others at its node's address. Outside SLURM, start torchrun on each node
yourself (`multi_node_command`, `is_host=1` on the first). torchrun restarts nothing (`--max-restarts 0`); one
node's failure ends the step (`--kill-on-bad-exit`), and its exit code is the job's.

The single-node job torchrun starts, with its environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
but not listening on the network. torchrun's flags cannot do that: torch's TCPStore binds the wildcard address
whatever host it is given (docs/findings.md, "torchrun listens on every address"). Here the store runs on a socket
this launcher binds to 127.0.0.1 (TCPStore's `master_listen_fd`), every process joins it as a client
(torchelastic's agent-store protocol), and gloo and NCCL open their sockets on the loopback device. The first
process to fail stops the others; the launcher names it and exits with its code.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta

LOOPBACK = "127.0.0.1"
# the signals a job is stopped with (margrpo.infra.stopping saves on each): every launcher passes them on to its
# processes, and torchrun forwards them to its workers rather than die of USR1 (its default list lacks it)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
# how long torchrun waits for its workers to save and exit once signalled before it kills them (its default: 30 s).
# Past any grace SLURM gives: SLURM's own SIGKILL (KillWait after a SIGTERM) stays the bound, not torchrun's.
SHUTDOWN_S = 900


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
    procs: list[subprocess.Popen] = []
    # Snakemake and SLURM stop a job with SIGTERM, a site's sbatch --signal may send USR1: pass them on, from
    # before the first process starts (a signal then would end this launcher); one that came while the processes
    # were being started goes to each started after it too
    asked: list[int] = []

    def forward(sig, _frame) -> None:
        asked.append(sig)
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    for sig in STOP_SIGNALS:
        signal.signal(sig, forward)
    for rank in range(world):
        procs.append(subprocess.Popen(command, env=worker_env(rank, world, port)))
        for sig in dict.fromkeys(asked):
            procs[-1].send_signal(sig)
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


def multi_node_command(
    nodes: int,
    per_node: int,
    endpoint: str,
    run_id: str,
    command: list[str],
    is_host: bool | None = None,
    local_addr: str | None = None,
) -> list[str]:
    """torchrun (`python -m torch.distributed.run`) for one node of an M-node job, its rendezvous at `endpoint`.
    `is_host`: whether this node's torchrun hosts the rendezvous store (None: torchrun guesses by matching the
    endpoint against its own names, which misses secondary interfaces and Debian's `127.0.1.1` hosts line);
    `local_addr`: the address the other nodes reach this one at (the workers' store when it is rank 0)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        *([] if is_host is None else [f"--rdzv-conf=is_host={int(is_host)}"]),
        *([] if local_addr is None else [f"--local-addr={local_addr}"]),
        "--max-restarts=0",
        f"--signals-to-handle={TORCHRUN_SIGNALS}",
        f"--shutdown-timeout={SHUTDOWN_S}",
        "--no-python",  # COMMAND is a program (`margrpo`), as for the single-node launcher, not a Python script
        *command,
    ]


def port_holder(port: int) -> str:
    """Who listens on `port` on this machine, as far as /proc tells: "SLURM job J (pid P)", "pid P", or ""."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                local, state, inode = line.split()[1], line.split()[3], line.split()[9]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                    inodes.add(f"socket:[{inode}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                job = next((e[13:].decode() for e in environ if e.startswith(b"SLURM_JOB_ID=")), None)
                return f"SLURM job {job} (pid {pid})" if job else f"pid {pid}"
    return ""


def reserve_port(addr: str, first: int, fixed: bool, tries: int = 64) -> socket.socket:
    """A socket listening on `addr` at `first`, or (not `fixed`) at the next free port after it: held by this
    launcher for the job's life, so no other job's store can take it and no agent of this job can join another
    job's store. A fixed port that is taken is an error naming its holder."""
    for port in range(first, first + (1 if fixed else tries)):
        sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
        try:
            sock.bind((addr, port))
            sock.listen(128)
            if port != first:
                print(f"margrpo.infra.launch: port {first} is taken; the rendezvous uses {port}", file=sys.stderr)
            return sock
        except OSError as err:
            sock.close()
            if err.errno == errno.EADDRNOTAVAIL:
                raise SystemExit(
                    f"margrpo.infra.launch: {addr} is not an address of {socket.gethostname()}: the launcher runs "
                    "on the job's first node (the batch script of a job whose rule has the `mpi` resource)"
                ) from err
            if err.errno != errno.EADDRINUSE:
                raise
    holder = port_holder(first) if fixed else ""
    raise SystemExit(
        f"margrpo.infra.launch: the rendezvous port {first} on {addr} is taken"
        + (f" by {holder}" if holder else "")
        + ("; train_port fixes it: choose another, or auto" if fixed else f" and so are the {tries - 1} after it")
    )


def launch_slurm(nodes: int, per_node: int, port: int | str, command: list[str]) -> int:
    """srun starts our node agent once on each of the job's nodes, each task with the job's CPUs per task; the
    agents' torchruns meet in a store this launcher hosts on the first node, at the address SLURM knows it by and
    a port it holds (`reserve_port`): no agent has to find out which node it is."""
    from torch.distributed import TCPStore

    from margrpo.infra.slurm import cpus_per_task, job_nodes, job_record, node_address, rendezvous_port

    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        raise SystemExit(
            f"margrpo.infra.launch: --nodes {nodes} runs inside a SLURM job of {nodes} nodes "
            "(SLURM_JOB_ID is unset); elsewhere run on each node (is_host=1 on the first, 0 on the others): "
            + " ".join(multi_node_command(nodes, per_node, "FIRST_NODE:PORT", "RUN_ID", command, is_host=True))
        )
    try:
        record = job_record(job_id)
        hosts = job_nodes(record)
    except (OSError, subprocess.CalledProcessError) as err:  # scontrol absent, or the job unknown to it
        why = err.stderr.strip() if isinstance(err, subprocess.CalledProcessError) and err.stderr else err
        raise SystemExit(f"margrpo.infra.launch: SLURM job {job_id}'s nodes cannot be read: {why}") from None
    if len(hosts) != nodes:
        raise SystemExit(f"margrpo.infra.launch: --nodes {nodes}, but SLURM job {job_id} holds {len(hosts)}: {hosts}")
    head = record.get("BatchHost") or socket.gethostname()  # this launcher runs in the batch script, there
    if head not in hosts:
        raise SystemExit(f"margrpo.infra.launch: SLURM job {job_id}'s batch host {head} is not one of its {hosts}")
    addr = node_address(head, peer=node_address(next(h for h in hosts if h != head)))
    listener = reserve_port(addr, rendezvous_port(job_id) if port == "auto" else int(port), fixed=port != "auto")
    port = listener.getsockname()[1]
    endpoint = f"{addr}:{port}"
    store = TCPStore(  # noqa: F841 (kept alive until srun returns)
        addr,
        port,
        is_master=True,
        wait_for_workers=False,
        multi_tenant=True,
        timeout=timedelta(minutes=30),
        master_listen_fd=listener.fileno(),
    )
    cpus = cpus_per_task(record)
    srun = [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        *([f"--cpus-per-task={cpus}"] if cpus else []),
        "--kill-on-bad-exit=1",  # one node's torchrun fails: the step ends, and the job with it
    ]
    agent = [sys.executable, "-m", "margrpo.infra.launch", "--node-agent", endpoint, "--nodes", str(nodes)]
    agent += [str(per_node), *command]
    print(
        f"margrpo.infra.launch: on {socket.gethostname()}, job {job_id}: {' '.join(srun + agent)}",
        file=sys.stderr,
        flush=True,
    )
    return _run_forwarding_stops(srun + agent)


def _run_forwarding_stops(command: list[str]) -> int:
    """Run srun's `command` to its end from this launcher, the batch script's process: `scancel --full`, `sbatch
    --signal=B:...` and a requeue signal it (the default action would end it and its store), from before srun
    starts. srun forwards TERM and USR1 to every node's torchrun; a lone SIGINT is srun's request for a status line,
    so INT goes on as TERM."""
    steps: list[subprocess.Popen] = []
    asked: list[int] = []

    def forward(sig, _frame) -> None:
        asked.append(signal.SIGTERM if sig == signal.SIGINT else sig)
        for step in steps:
            if step.poll() is None:
                step.send_signal(asked[-1])

    for sig in STOP_SIGNALS:
        signal.signal(sig, forward)
    try:
        steps.append(subprocess.Popen(command))
    except FileNotFoundError:
        from margrpo.infra.slurm import missing_command_message

        raise SystemExit(f"margrpo.infra.launch: {missing_command_message(command[0])}") from None
    for sig in dict.fromkeys(asked):
        steps[0].send_signal(sig)
    return steps[0].wait()


def interface_of(addr: str) -> str | None:
    """The network interface holding IPv4 `addr` on this machine (Linux), or None."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):  # SIOCGIFADDR: an interface without an IPv4 address raises
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                if socket.inet_ntoa(packed[20:24]) == addr:
                    return name
    return None


def node_agent(endpoint: str, nodes: int, per_node: int, command: list[str]) -> int:
    """One node's torchrun (run by `launch_slurm`'s srun): a client of the launcher's store, reached by the others
    at this node's address (`slurm.node_address`), and gloo's and NCCL's sockets on that address's interface unless
    the job's environment names one (gloo would bind what the host name resolves to: 127.0.1.1 on Debian). The
    process becomes torchrun, so srun's signals reach it."""
    from margrpo.infra.slurm import node_address

    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    addr = node_address(name, peer=endpoint.rsplit(":", 1)[0])
    interface = interface_of(addr)
    for sockets in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # set in the job's environment: that one wins
        if interface and sockets not in os.environ:
            os.environ[sockets] = interface
    print(
        f"margrpo.infra.launch: node agent on {name} (node {os.environ.get('SLURM_NODEID', '?')} of {nodes}): "
        f"address {addr} ({interface or 'interface unknown'}; gloo {os.environ.get('GLOO_SOCKET_IFNAME', 'its own')}, "
        f"NCCL {os.environ.get('NCCL_SOCKET_IFNAME', 'its own')}), {len(os.sched_getaffinity(0))} CPUs, "
        f"GPUs {os.environ.get('CUDA_VISIBLE_DEVICES', 'none')}",
        file=sys.stderr,
        flush=True,
    )
    run_id = os.environ.get("SLURM_JOB_ID", endpoint)
    torchrun = multi_node_command(nodes, per_node, endpoint, run_id, command, is_host=False, local_addr=addr)
    os.execv(torchrun[0], torchrun)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m margrpo.infra.launch", description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1, help="nodes of the job (> 1: under SLURM, torchrun on each)")
    parser.add_argument(
        "--port", default="auto", help="the rendezvous port on the first node (--nodes > 1); auto: from the job id"
    )
    parser.add_argument("--node-agent", metavar="ADDR:PORT", help=argparse.SUPPRESS)  # srun's command, per node
    parser.add_argument("processes", type=int, help="processes per node (one GPU each on cuda)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.processes < 1 or args.nodes < 1 or not args.command:
        parser.error("N >= 1 processes, --nodes >= 1 and a COMMAND are needed")
    if args.port != "auto" and not (args.port.isdigit() and 1024 <= int(args.port) <= 65535):
        parser.error(f"--port {args.port}: expected auto or a port in 1024-65535")
    if args.node_agent:
        return node_agent(args.node_agent, args.nodes, args.processes, args.command)
    from margrpo.infra.slurm import segment_header

    print(segment_header(), file=sys.stderr, flush=True)  # heads this job's part of a log that retries append to
    if args.nodes > 1:
        return launch_slurm(args.nodes, args.processes, args.port, args.command)
    return launch(args.processes, args.command)


if __name__ == "__main__":
    sys.exit(main())
