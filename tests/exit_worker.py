"""Run by tests/test_process_exit.py as 2 processes (`python -m margrpo.infra.launch 2 python exit_worker.py`): a
gloo collective whose Python callback still runs on a `pt_gloo_runloop` thread (sleeping, as a thread starved of
CPU would be) when the main thread ends; with LEAVE=1 the process leaves its group first, as `margrpo train` does."""

import os
import time

import torch
import torch.distributed as dist

from margrpo.infra.process_group import leave_process_group

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1), async_op=True).get_future().then(lambda _: time.sleep(1.0))
time.sleep(0.2)  # the callback has begun
if os.environ.get("LEAVE"):
    leave_process_group()
