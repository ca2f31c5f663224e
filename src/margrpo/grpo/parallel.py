"""Data parallelism through torch's engines: the one place that wraps a plain policy (the policy never knows).

`parallelize` takes a policy whose trained parameters are already chosen (`requires_grad`) and returns an
`Engine` that the trainer drives the same way whatever the sharding (`policies.<name>.sharding`):

- `replicate`: DistributedDataParallel. DDP synchronises gradients only for passes through its wrapper's
  `forward`, while a MAR policy is driven through its methods (`ar_forward`, `head`, ...), so DDP wraps a thin
  module (`LossModule`) whose forward is the trainer's micro-batch loss; the policy is its child.
- `full_shard` (ZeRO-3) / `shard_grad_op` (ZeRO-2): FSDP2 (`fully_shard`) on every block of the policy's
  `nn.ModuleList`s, on the children of each module that holds only head parameters, then on the policy itself
  with its interface methods registered as forward methods (`root_methods`). Frozen parameters outside the AR
  and the head (text encoder, VAE) are left out (`ignored_params`): whole on every GPU.

Both sum gradients over processes (each process's loss is its share of the batch loss): N processes take the
step one process takes on the whole batch. With one process nothing is wrapped and nothing communicates.

The micro-batch gradient statistic (Fig. 2a / 5) needs each micro-batch's *local* gradient, which both engines
reduce inside backward. DDP: the trainer accumulates micro-batches under `no_sync`, where the local gradient is
in `.grad`, and the last one's is read in DDP's communication hook, before its all-reduce. FSDP: every
micro-batch is reduced (sharded gradients accumulate) and its local gradient is read as the input of FSDP's
reduce-scatter (`set_custom_reduce_scatter`), summed over the parts in which FSDP reduces a group
(`LocalSquares`). What FSDP does not let us read exactly (a group reduced in parts of different layouts) makes
the statistic NaN rather than wrong (docs/real-scale.md, "What the engines cannot do").
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

SHARDINGS = ("replicate", "full_shard", "shard_grad_op")
# the interface methods that use the policy's own (root) parameters: FSDP must all-gather around each
FORWARD_METHODS = ("encode_prompts", "prepare_condition", "null_condition", "ar_forward", "head", "encode", "decode")


class LossModule(nn.Module):
    """The trainer's micro-batch loss as a module's forward, so DDP can wrap it; the policy is its child."""

    def __init__(self, policy: nn.Module, loss_fn: Callable):
        super().__init__()
        self.policy, self.loss_fn = policy, loss_fn

    def forward(self, *args, **kwargs):
        return self.loss_fn(*args, **kwargs)


@dataclass
class LocalSquares:
    """Squared norms of each micro-batch's local gradient of the statistic's parameters, filled by the engines'
    hooks, and whether every one was exact.

    FSDP reduces a group once per post-backward, and a group runs several (a module used twice in one backward,
    the root whose methods' inputs carry gradients back mid-backward, a chunk's accumulated gradient and the
    next's): each part's input is summed per group (the parts share one layout: the same parameters) and the sum
    is squared when the micro-batch ends. A part of another layout cannot be added element by element: the
    micro-batch is then inexact and the variance NaN. The sums cost one fp32 copy of this process's local gradient
    of the statistic's groups during a micro-batch's backward."""

    total: torch.Tensor = field(default_factory=lambda: torch.zeros((), dtype=torch.float64))
    exact: bool = True
    pending: dict[int, torch.Tensor] = field(default_factory=dict)  # FSDP: each group's local gradient so far

    def add(self, sq: torch.Tensor) -> None:
        self.total += sq.detach().double().cpu()

    def add_later(self, key: int, grad: torch.Tensor) -> None:
        if key not in self.pending:
            self.pending[key] = grad.detach().float().clone()
        elif self.pending[key].shape == grad.shape:
            self.pending[key] += grad.detach().float()
        else:
            self.exact = False

    def end_micro_batch(self) -> None:
        for g in self.pending.values():
            self.add(g.square().sum(dtype=torch.float64))
        self.pending.clear()


class Engine:
    """How the trainer runs a micro-batch's loss and backward, synchronises, saves and loads (one process)."""

    sharding: str | None = None
    world = 1

    def __init__(self, policy: nn.Module):
        self.policy = policy
        self.squares: LocalSquares | None = None  # set by the gradient statistic for one optimizer step

    def loss(self, fn: Callable, *args, **kwargs):
        return fn(*args, **kwargs)

    def sync(self, enabled: bool):
        """Gradients are reduced over processes in the backward passes run inside this block only when `enabled`."""
        return nullcontext()

    @property
    def reads_local_grads(self) -> bool:
        """Whether each micro-batch's local gradient is in `.grad` after its backward (else the engine reports
        its square through `squares`)."""
        return True

    def full_state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """Every parameter and buffer of `module`, whole and on the CPU (on every process; collective when sharded)."""
        return {k: v.detach().cpu() for k, v in _named_tensors(module).items()}

    @torch.no_grad()
    def load_full_state(self, module: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Write whole tensors (by name) into `module`'s parameters and buffers, each process keeping its share."""
        tensors = _named_tensors(module)
        for k, v in state.items():
            tensors[k].copy_(_shard_like(v, tensors[k]))

    def full_tensors(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Whole CPU copies of tensors that may be shards (collective when sharded)."""
        return {k: _full(v).cpu() for k, v in values.items()}

    def shard_like(self, values: dict[str, torch.Tensor], like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: _shard_like(v.to(_local(like[k]).device), like[k]) for k, v in values.items()}

    def optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> dict:
        """The optimizer's state keyed by parameter name, whole: it loads under any number of processes."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, model: nn.Module, state: dict) -> None:
        """A state of `optimizer_state` (names), or an older one keyed by parameter index (one process)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if all(isinstance(i, int) for g in state.get("param_groups", []) for i in g["params"]):
            optimizer.load_state_dict(state)
            return
        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


class DDPEngine(Engine):
    sharding = "replicate"

    def __init__(self, policy: nn.Module, loss_fn: Callable, stat_params: list[nn.Parameter], device: torch.device):
        super().__init__(policy)
        from torch.nn.parallel import DistributedDataParallel

        self.world = dist.get_world_size()
        self.module = LossModule(policy, loss_fn)
        ids = None if device.type == "cpu" else [device.index]
        # broadcast_buffers off: the policies' buffers are constants, and a broadcast per forward costs time
        self.ddp = DistributedDataParallel(self.module, device_ids=ids, broadcast_buffers=False)
        self.stat_ids = {id(p) for p in stat_params}
        self.prev: dict[int, torch.Tensor] = {}  # the statistic's snapshot of .grad before the last micro-batch
        self.ddp.register_comm_hook(None, self._sum_hook)

    def loss(self, fn: Callable, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def sync(self, enabled: bool):
        return nullcontext() if enabled else self.ddp.no_sync()

    def _sum_hook(self, _, bucket):  # no return annotation: DDP checks it against Future[Tensor], and ours is a string
        """Sum (not average) the bucket over processes; first, the local gradient of the last micro-batch:
        the bucket (the accumulated local gradient) minus the snapshot taken before it."""
        if self.squares is not None:
            for p, g in zip(bucket.parameters(), bucket.gradients()):
                if id(p) in self.stat_ids:
                    prev = self.prev.get(id(p))
                    local = g.float() if prev is None else g.float() - prev.float()
                    self.squares.add(local.square().sum(dtype=torch.float64))
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


class FSDPEngine(Engine):
    def __init__(
        self,
        policy: nn.Module,
        sharding: str,
        stat_params: list[nn.Parameter],
        head_params: set[int],
        mixed_precision: str,
        device: torch.device,
    ):
        super().__init__(policy)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

        self.sharding, self.world = sharding, dist.get_world_size()
        self.mesh = init_device_mesh(device.type, (self.world,))
        bf16 = mixed_precision == "bf16" and device.type == "cuda"  # on CPU the toy runs in fp32
        self.kwargs = dict(
            mesh=self.mesh,
            reshard_after_forward=sharding == "full_shard",
            mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if bf16
            else MixedPrecisionPolicy(),
        )
        trained_ids = {id(p) for p in policy.parameters() if p.requires_grad}
        stat_ids = {id(p) for p in stat_params}
        self.units = shard_units(policy, head_params)
        ignored = outside_units(policy, head_params)
        # which groups the statistic reads, decided on the plain parameters (FSDP replaces them by shards)
        counted = [
            _counts_for_statistic(m, [u for u in self.units if u is not m], trained_ids, stat_ids)
            for m in [*self.units, policy]
        ]
        methods = root_methods(policy, self.units, head_params)
        for unit in self.units:
            fully_shard(unit, **self.kwargs)
        fully_shard(policy, **self.kwargs, ignored_params=ignored)
        for name in methods:
            register_fsdp_forward_method(policy, name)
        for key, (module, counts) in enumerate(zip([*self.units, policy], counted)):
            # sum, not mean: each process's loss is its share of the batch loss (gloo has no pre-multiplied sum)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
            module.set_custom_reduce_scatter(_CountingReduceScatter(self, key if counts else None))
        self.policy = policy

    def sync(self, enabled: bool):
        @contextmanager
        def block():
            self.policy.set_requires_gradient_sync(enabled)
            # the root always reduces: its methods' inputs can carry gradients back mid-backward, which reduces it in
            # parts, and parts of chunks accumulated locally would mix layouts the statistic cannot add (add_later)
            self.policy.set_requires_gradient_sync(True, recurse=False)
            try:
                yield
            finally:
                self.policy.set_requires_gradient_sync(True)

        return block()

    @property
    def reads_local_grads(self) -> bool:
        return False

    def full_state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        return {k: _full(v).cpu() for k, v in _named_tensors(module).items()}


class _CountingReduceScatter:
    """FSDP's reduce-scatter (a sum) that first adds the squared norm of its input, this process's unsharded
    gradient of the group, to the statistic (`key` None: a group outside the statistic)."""

    def __init__(self, engine: FSDPEngine, key: int | None):
        self.engine, self.key = engine, key

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        squares = self.engine.squares
        if squares is not None and self.key is not None:
            squares.add_later(self.key, input_tensor)
        return dist.reduce_scatter_single(
            output=output_tensor, input=input_tensor, group=group, op=op, async_op=async_op
        )


def _register_reduce_scatter_type() -> None:
    """FSDP checks custom comms against its ReduceScatter interface."""
    from torch.distributed.fsdp._fully_shard import _fsdp_api

    _fsdp_api.ReduceScatter.register(_CountingReduceScatter)


def parallelize(
    policy: nn.Module,
    sharding: str,
    loss_fn: Callable,
    stat_params: list[nn.Parameter],
    head_params: list[nn.Parameter],
    mixed_precision: str,
    device: torch.device,
) -> Engine:
    """The engine for this process: plain with one process, else DDP (`replicate`) or FSDP2 (the shardings).
    Every process must start from the same weights (rank 0's are broadcast first)."""
    if sharding not in SHARDINGS:
        raise ValueError(f"sharding {sharding!r}: expected one of {', '.join(SHARDINGS)}")
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return Engine(policy)
    for t in [*policy.parameters(), *policy.buffers()]:  # LoRA adapters start at random on each process
        dist.broadcast(t.data, src=0)
    if sharding == "replicate":
        return DDPEngine(policy, loss_fn, stat_params, device)
    _register_reduce_scatter_type()
    return FSDPEngine(policy, sharding, stat_params, {id(p) for p in head_params}, mixed_precision, device)


def shard_reference(ref: nn.Module, engine: Engine) -> None:
    """The KL reference sharded as the policy is (resharded after each no-grad forward); replicated otherwise."""
    if not isinstance(engine, FSDPEngine):
        return
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    kwargs = {**engine.kwargs, "reshard_after_forward": True}
    head = {id(p) for p in ref.head_parameters()}
    units = shard_units(ref, head)
    methods = root_methods(ref, units, head)
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(ref, **kwargs, ignored_params=outside_units(ref, head))
    for name in methods:
        register_fsdp_forward_method(ref, name)


def root_methods(policy: nn.Module, units: list[nn.Module], head: set[int]) -> list[str]:
    """The interface methods to register on the root. `head` only if a head parameter is left in the root group:
    else the head's own groups all-gather for it, and registering it would hook the root's post-backward on the
    head's input z, which reduces the root's gradient in two parts whenever it is accumulated over chunks."""
    in_units = {id(p) for u in units for p in u.parameters()}
    head_in_root = any(id(p) in head and id(p) not in in_units for p in policy.parameters())
    return [m for m in FORWARD_METHODS if hasattr(policy, m) and (m != "head" or head_in_root)]


# --- the sharding plan, read off the module tree ------------------------------------------------------------------
def _ar_and_head(policy: nn.Module, head: set[int]) -> set[int]:
    ar = {id(p) for p in policy.ar_parameters()} if hasattr(policy, "ar_parameters") else set()
    return ar | head


def shard_units(policy: nn.Module, head: set[int]) -> list[nn.Module]:
    """The FSDP groups below the root, innermost first: every element of an nn.ModuleList made only of AR or head
    parameters (the transformer blocks), then each child of the largest modules made only of head parameters.
    Children, not the head module itself: a policy may call into its head below the head's own forward (Harmon's
    `mar.diffloss.net`), and FSDP gathers a group only around its module's forward. Parameters held by a head
    module directly stay in the root group (and `head` is then registered on the root)."""
    model = _ar_and_head(policy, head)
    inside = lambda m, ids: bool(list(m.parameters())) and all(id(p) in ids for p in m.parameters())  # noqa: E731
    units = [b for m in policy.modules() if isinstance(m, nn.ModuleList) for b in m if inside(b, model)]
    for name, m in policy.named_modules():
        parent = policy.get_submodule(name.rsplit(".", 1)[0]) if "." in name else policy
        if m is not policy and inside(m, head) and not inside(parent, head):
            units += [c for c in _leaves_outside(m, units) if inside(c, head)]
    return units


def _leaves_outside(module: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """The children of `module` that hold parameters outside `units`, looking through containers (ModuleList,
    Sequential children that are themselves only containers of units)."""
    taken = {id(p) for u in units for p in u.parameters()}
    out = []
    for child in module.children():
        if all(id(p) in taken for p in child.parameters()):
            continue
        if isinstance(child, nn.ModuleList):
            out += _leaves_outside(child, units)
        elif any(id(p) in taken for p in child.parameters()):  # holds units: its own remainder groups below it
            out += _leaves_outside(child, units)
        else:
            out.append(child)
    return out


def outside_units(policy: nn.Module, head: set[int]) -> set[nn.Parameter]:
    """Parameters in neither the AR nor the head (frozen encoders): FSDP leaves them whole and alone."""
    model = _ar_and_head(policy, head)
    return {p for p in policy.parameters() if id(p) not in model}


def _counts_for_statistic(module: nn.Module, others: list[nn.Module], trained: set[int], stat: set[int]) -> bool:
    """Whether the FSDP group of `module` (its parameters outside the groups `others` nested in it) holds the
    gradient statistic's parameters; a group holding them beside other trained ones cannot be read whole."""
    nested = {id(p) for m in others if any(m is x for x in module.modules()) for p in m.parameters()}
    own = [id(p) for p in module.parameters() if id(p) not in nested and id(p) in trained]
    hits = [i for i in own if i in stat]
    if hits and len(hits) != len(own):
        raise ValueError(
            f"FSDP group {type(module).__name__} mixes parameters of the gradient statistic with other "
            "trained ones; the statistic reads whole groups"
        )
    return bool(hits)


def _named_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(module.named_buffers()), **dict(module.named_parameters())}


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`full` cut as `like` is (this process's share of a DTensor, else whole), on like's device, in its own dtype."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    full = full.to(_local(like).device)
    if isinstance(like, DTensor):
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    return full
