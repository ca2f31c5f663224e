"""Data parallelism inside one GRPO run: each process rolls out its share of the prompt groups.

A group never spans processes, so advantages stay per group and need no communication. What is
communicated: the loss's token counts (the batch's token mean is over every process's tokens), the
gradients (summed, so W processes take exactly the step one process takes on the whole batch),
and what is logged. The policy is not wrapped in DistributedDataParallel: DDP synchronises
gradients only for passes through the wrapper's `forward`, while a MAR policy is driven through
its methods (`ar_forward`, `head`, ...). One summed all-reduce per optimizer step (bucketed) does
what DDP's reducer does, and leaves the micro-batch gradient statistic exact.

With one process every function here is the identity and communicates nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

BUCKET_ELEMENTS = 1 << 26  # 256 MB of float32 per all-reduce


def shard(n: int, rank: int, world: int) -> range:
    """The contiguous share of n items (prompt groups) that process `rank` of `world` takes."""
    if n % world:
        raise ValueError(f"grpo.batch_prompts ({n}) must be a multiple of the number of processes ({world}): "
                         "every process rolls out whole prompt groups, the same number each")
    size = n // world
    return range(rank * size, (rank + 1) * size)


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _comm_device() -> torch.device:
    """Where collectives run: NCCL reduces GPU tensors only, gloo CPU ones."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_sum(x: torch.Tensor) -> torch.Tensor:
    """x summed over processes, on x's device (a new tensor; x itself with one process)."""
    if not active():
        return x
    y = x.to(_comm_device(), copy=True)
    dist.all_reduce(y)
    return y.to(x.device)


def all_cat(x: torch.Tensor) -> torch.Tensor:
    """Every process's x (same shape on each) concatenated along dim 0, in rank order, on x's device."""
    if not active():
        return x
    y = x.to(_comm_device()).contiguous()
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, y)
    return torch.cat(parts).to(x.device)


def all_objects(obj) -> list:
    """Every process's picklable `obj`, in rank order."""
    if not active():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_parameters(module: torch.nn.Module) -> None:
    """Every process starts from rank 0's parameters and buffers (LoRA adapters are initialised at random)."""
    if active():
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)


def sum_gradients(params: list[torch.nn.Parameter]) -> None:
    """Sum the gradients of `params` over processes, in place. A parameter without a gradient on every
    process keeps none (as with one process); one with a gradient on some process gets zeros elsewhere."""
    if not active():
        return
    has = all_sum(torch.tensor([p.grad is not None for p in params], dtype=torch.int32))
    grads = []
    for p, h in zip(params, has.tolist()):
        if h and p.grad is None:
            p.grad = torch.zeros_like(p)
        if h:
            grads.append(p.grad)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:  # the same order on every process: `has` is agreed
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        bucket, size = [], 0
        for g in same:
            bucket.append(g)
            size += g.numel()
            if size >= BUCKET_ELEMENTS:
                _all_reduce_bucket(bucket)
                bucket, size = [], 0
        if bucket:
            _all_reduce_bucket(bucket)


def _all_reduce_bucket(grads: list[torch.Tensor]) -> None:
    """One all-reduce for several gradients (of one dtype): flatten, sum, copy back."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def barrier() -> None:
    if active():
        dist.barrier()
