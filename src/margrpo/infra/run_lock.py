"""One writer per run folder: a train job holds an exclusive lock on `<state>/.lock` for its whole life.

Two jobs in one run folder (a second Snakemake, a run by hand beside a cluster job) would resume from each other's
checkpoints and delete each other's temporary shards. `fcntl.flock` is released by the kernel when the process
dies, however it dies, so a lock left by a killed job never blocks the next one; the file only says who held it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from margrpo.infra.files import InputError

LOCK = ".lock"


@contextlib.contextmanager
def hold_run_folder(state_dir: str | Path) -> Iterator[None]:
    """Hold `state_dir`'s lock for the block; another holder alive makes this fail at once, naming it."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "a process that wrote no name"
            raise InputError(
                f"{state_dir}: another train job writes this run folder ({holder}); wait for it to end or stop it "
                "(its lock goes with its process)"
            ) from None
        os.ftruncate(fd, 0)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {stamp}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock (if held)
