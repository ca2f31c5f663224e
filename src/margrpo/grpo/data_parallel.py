"""Data parallelism inside one GRPO run: each process rolls out its share of the prompt groups.

A group never spans processes, so advantages stay per group and need no communication. What is
communicated here: the loss's token counts (the batch's token mean is over every process's tokens)
and what is logged. The gradients are torch's engines' business (DDP or FSDP2, `grpo.parallel`).

With one process every function here is the identity and communicates nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def shard(n: int, rank: int, world: int) -> range:
    """The contiguous share of n items (prompt groups) that process `rank` of `world` takes."""
    if n % world:
        raise ValueError(
            f"grpo.batch_prompts ({n}) must be a multiple of the number of processes ({world}): "
            "every process rolls out whole prompt groups, the same number each"
        )
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


def barrier() -> None:
    if active():
        dist.barrier()
