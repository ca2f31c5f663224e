"""Leaving a data-parallel job's process groups so that none of their threads outlives the process (issue 81).

A group that outlives `destroy_process_group` keeps its backend's threads (gloo's `pt_gloo_runloop` workers and its
`gloo_tcp_loop`) running into the interpreter's exit, where one that still holds Python objects of a finished
collective (the callback of DDP's communication hook) cannot take the GIL any more: a process that did its work
aborts, "terminate called without an active exception" or "Fatal Python error: _PyThreadState_DeleteCurrent",
exit 134 (tests/test_process_exit.py). `margrpo train` leaves its groups at a run's end and after a stop, and an
exit handler does it after an error.
"""

from __future__ import annotations

import atexit
import gc
import logging
import sys
import warnings
from pathlib import Path

log = logging.getLogger("margrpo")


def leave_process_group(meet: bool = True) -> None:
    """End this process's part of a data-parallel job: all ranks meet (`meet`), then every process group goes, with
    what held one past `destroy_process_group`, and so every thread of their backends."""
    dist = sys.modules.get("torch.distributed")  # never imported by a single-process stage: nothing to leave
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    if meet:
        dist.barrier()
    for last in ("last_exc", "last_traceback", "last_value", "last_type"):  # an error's frames hold the trainer
        if hasattr(sys, last):
            setattr(sys, last, None)
    _release_process_group_holders()
    dist.destroy_process_group()
    gc.collect()  # the holders released above are cycles now: collected, their groups with them
    left = backend_threads()
    if left:
        log.warning("process group destroyed, but its threads %s still run: this process may abort at exit", left)


def leave_at_exit() -> None:
    """However the process ends (an error, a SystemExit), its groups go before the interpreter does; no barrier
    then, the other processes may have ended. A no-op after a clean `leave_process_group`."""
    atexit.register(leave_process_group, meet=False)


def _release_process_group_holders() -> None:
    """What keeps a process group alive past `destroy_process_group`, through references gc cannot break: a
    DistributedDataParallel's reducer (C++) holds its communication hook, a bound method of the engine that holds
    the DDP module and so the reducer; FSDP's device mesh holds its groups, and DTensor's caches of redistribution
    plans (module globals) hold the mesh. Run once the job's last step is over: the reducers go, every mesh lets its
    groups go."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.nn.parallel import DistributedDataParallel

    with warnings.catch_warnings():  # isinstance on torch's deprecated objects (reduce_op) warns
        warnings.simplefilter("ignore", FutureWarning)
        holders = [o for o in gc.get_objects() if isinstance(o, (DistributedDataParallel, DeviceMesh))]
    for holder in holders:
        if isinstance(holder, DistributedDataParallel):
            for name in ("logger", "reducer"):  # the logger (C++) holds the reducer too
                holder.__dict__.pop(name, None)
        elif isinstance(holder, DeviceMesh) and isinstance(getattr(holder, "_pg_registry", None), dict):
            holder._pg_registry.clear()


def backend_threads() -> list[str]:
    """The threads of process-group backends this process still runs (Linux: their names under /proc)."""
    names = []
    for task in Path("/proc/self/task").glob("*/comm"):
        try:
            names.append(task.read_text().strip())
        except OSError:  # a thread that ended meanwhile
            continue
    return sorted(n for n in names if n.startswith(("pt_gloo", "gloo_", "pt_nccl", "nccl")))
