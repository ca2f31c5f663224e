"""The processes of one GRPO run, as the trainer sees them: the one object that knows them.

`Engine` answers what the trainer asks about processes: which prompt groups and validation batches are this
process's, how processes meet (barriers, collectives), when a micro-batch's backward reduces its gradients,
and how a policy's whole weights are written and read (torch's state-dict API). The training state is each
process's own (grpo.checkpoints: torch.distributed.checkpoint reshards it on load). With one process it communicates
nothing. `grpo.parallel` subclasses it for torch's engines (DDP, FSDP2) and `parallelize` picks one.

A group never spans processes, so advantages stay per group; what crosses processes is the loss's token counts
(the batch's token mean is over every process's tokens), the gradients (the engines) and what is logged.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from margrpo.infra.runtime import autocast


def distributed() -> bool:
    """Whether this process is one of several (a process group of more than one)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def join_process_group(device: str) -> torch.device:
    """Join the process group a launcher (torchrun, margrpo.infra.launch) set up in the environment: gloo on CPU,
    NCCL on GPUs, one GPU a process (LOCAL_RANK). Returns this process's device."""
    import os

    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def shard(n: int, rank: int, world: int) -> range:
    """The contiguous share of n items (prompt groups) that process `rank` of `world` takes."""
    if n % world:
        raise ValueError(
            f"grpo.batch_prompts ({n}) must be a multiple of the number of processes ({world}): "
            "every process rolls out whole prompt groups, the same number each"
        )
    size = n // world
    return range(rank * size, (rank + 1) * size)


class Engine:
    """One process, or the base of torch's engines: everything here is also right for several replicas."""

    collective_forward = False  # every forward is a collective (FSDP): processes run their batches in lockstep

    def __init__(self, policy: nn.Module, device: torch.device, precision: str = "no"):
        self.policy, self.device, self.precision = policy, torch.device(device), precision
        self.world = dist.get_world_size() if distributed() else 1
        self.rank = dist.get_rank() if distributed() else 0
        self._after_autocast: OrderedDict[int, Callable[[], None]] = OrderedDict()  # register_autocast_exit_hook

    # --- the processes ------------------------------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        """The process that writes the run's files and logs."""
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def _comm_device(self) -> torch.device:
        """Where collectives run: NCCL reduces GPU tensors only, gloo CPU ones."""
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def all_sum(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over processes, on x's device (a new tensor; x itself with one process)."""
        if self.world == 1:
            return x
        y = x.to(self._comm_device(), copy=True)
        dist.all_reduce(y)
        return y.to(x.device)

    def any_process(self, flag: bool) -> bool:
        """Whether any process says `flag`: one all-reduce of one float where there are several, none on one."""
        return flag if self.world == 1 else self.all_sum(torch.tensor([float(flag)])).item() > 0

    def all_cat(self, x: torch.Tensor) -> torch.Tensor:
        """Every process's x (same shape on each) concatenated along dim 0, in rank order, on x's device."""
        if self.world == 1:
            return x
        y = x.to(self._comm_device()).contiguous()
        parts = [torch.empty_like(y) for _ in range(self.world)]
        dist.all_gather(parts, y)
        return torch.cat(parts).to(x.device)

    def all_objects(self, obj) -> list:
        """Every process's picklable `obj`, in rank order."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def from_main(self, obj):
        """The main process's picklable `obj`, on every process."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # --- how work splits ----------------------------------------------------------------------------------------
    def prompt_groups(self, n: int) -> range:
        """The prompt groups of an n-group batch that this process rolls out."""
        return shard(n, self.rank, self.world)

    def validation_share(self, starts: list[int]) -> tuple[list[int], int]:
        """This process's validation batches (batch i goes to process i mod world) and how many rounds it runs:
        where every forward is collective, each process runs as many (it repeats its first and drops the repeats)."""
        mine = starts[self.rank :: self.world]
        return mine, -(-len(starts) // self.world) if self.collective_forward else len(mine)

    # --- mixed precision ----------------------------------------------------------------------------------------
    def autocast(self):
        """torch.autocast for the run's precision (`mixed_precision`), around every forward the trainer runs: the one
        mixed-precision mechanism, whatever the sharding (FSDP gathers float32 parameters and casts nothing)."""
        region = autocast(self.device, self.precision)
        return _then(region, list(self._after_autocast.values())) if self._after_autocast else region

    def register_autocast_exit_hook(self, hook: Callable[[], None]) -> RemovableHandle:
        """`hook()` after each autocast region of the trainer's closes, until the handle's `remove()`: an instrument's
        view of the regions (margrpo plan ends CUDA's cache of cast weights with the outermost one)."""
        handle = RemovableHandle(self._after_autocast)
        self._after_autocast[handle.id] = hook
        return handle

    # --- a micro-batch's loss and backward ----------------------------------------------------------------------
    reduces_each_micro_batch = False  # FSDP: every micro-batch's gradient is reduced into the shards after it

    def forward(self, loss: Callable[[], tuple[torch.Tensor, dict]]) -> tuple[torch.Tensor, dict]:
        """`loss()`, the trainer's micro-batch loss, run where the engine can see it (DDP: inside its forward)."""
        return loss()

    def reduces(self, last_micro_batch: bool, last_chunk: bool) -> bool:
        """Whether the backward of this chunk of a micro-batch reduces the gradients over processes. Each process's
        loss is its share of the batch loss, so the reduced gradients sum to the batch gradient; here (and under
        DDP) once, after the last micro-batch: micro-batches and a chunked replay's chunks accumulate locally."""
        return last_micro_batch and last_chunk

    def sync(self, enabled: bool):
        """Gradients are reduced over processes in the backward passes run inside this block only when `enabled`."""
        return contextlib.nullcontext()

    def observe_local_gradients(self, params: list[nn.Parameter], observer: Callable) -> None:
        """Have `observer(param, local_grad)` see each of `params`' gradients as this process holds it, just before
        the engine reduces it over processes, where the engine reduces inside a hook of its own (DDP). Here nothing
        is reduced, and under FSDP `.grad` shows the reduced shards: it is never called. Whoever builds the engine
        attaches an observer (grpo.build: the gradient-variance probe); the engine knows none."""

    def release_gathered(self) -> None:
        """Drop whatever whole weights the engine gathered for a step (a step given up: grpo.trainer.StepGuard)."""

    def clip_grad_norm(self, params: list[nn.Parameter], max_norm: float) -> float:
        """The total norm of `params`' reduced gradients over every process, clipped to `max_norm` (inf: measured
        only, a scale of exactly 1). Under FSDP torch returns it as a DTensor, gathered here."""
        return float(full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm)))

    def shard_sum(self, x: torch.Tensor) -> torch.Tensor:
        """A per-shard quantity (a sharded gradient's squared norm) summed once over the shards of every process."""
        return self.all_sum(x)

    # --- state --------------------------------------------------------------------------------------------------
    def save_policy(self, module: nn.Module, write: Callable[[nn.Module], None]) -> None:
        """`write(m)` on the main process, `m` a plain module holding `module`'s whole weights (collective)."""
        if self.is_main:
            write(module)

    def load_policy_state(self, module: nn.Module, loaded: nn.Module | None) -> None:
        """The weights of `loaded` (a whole policy read by the main process alone; None elsewhere) into `module`,
        each process keeping its share: torch's state-dict API (`set_model_state_dict`, broadcast from the main
        process) for the state dict, the LoRA adapters, which the policies' state dicts leave out, beside it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        if self.world == 1:  # by name: the adapters and the base weights alike
            tensors = _named_tensors(module)
            with torch.no_grad():
                for name, value in _named_tensors(loaded).items():
                    tensors[name].copy_(value)
            return
        if not adapter_tensors(module):
            options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
            set_model_state_dict(module, loaded.state_dict() if self.is_main else {}, options=options)
            return
        # LoRA: the adapters' load hooks rename what torch's loader matches by name, so tensor by tensor
        source = _named_tensors(loaded) if self.is_main else {}
        with torch.no_grad():
            for name, like in _named_tensors(module).items():
                full = source[name] if self.is_main else torch.empty(like.shape, dtype=like.dtype)
                full = full.to(self._comm_device(), like.dtype).contiguous()
                dist.broadcast(full, src=0)
                local_shard(like).copy_(local_shard(_shard_like(full, like)))

    def full_tensors(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Whole CPU copies of tensors that may be shards (collective when sharded)."""
        return {k: full_tensor(v).cpu() for k, v in values.items()}

    def shard_like(self, values: dict[str, torch.Tensor], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Whole tensors cut as `like`'s are (this process's share of a shard, else whole), on like's devices."""
        return {k: _shard_like(v.to(local_shard(like[k]).device), like[k]) for k, v in values.items()}

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module, state: dict | None) -> None:
        """A whole optimizer state keyed by parameter name (a checkpoint of before issue 52; read by the main process
        alone, None elsewhere), or an older one keyed by parameter index (one process)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if self.world == 1 and all(isinstance(i, int) for g in state.get("param_groups", []) for i in g["params"]):
            optimizer.load_state_dict(state)
            return
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=self.world > 1)
        set_optimizer_state_dict(model, optimizer, state if self.is_main or self.world == 1 else {}, options=options)


@contextlib.contextmanager
def _then(region, hooks: list[Callable[[], None]]):
    """`region`, then each hook once it has closed (not after an error)."""
    with region:
        yield
    for hook in hooks:
        hook()


def adapter_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA adapters' parameters by name (policy.lora), which a policy's state dict leaves out: it holds the
    base weights under their own names."""
    return {n: p for n, p in module.named_parameters() if ".lora_" in n}


def _named_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_buffers()), **dict(module.named_parameters())}


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of a DTensor (FSDP), else `t`: the one place a sharded tensor is unwrapped."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole (a collective under FSDP: every process calls it), else `t`."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`full` cut as `like` is (this process's share of a DTensor, else whole), on like's device, in its own dtype."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    full = full.to(local_shard(like).device)
    if isinstance(like, DTensor):
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    return full
