"""Data parallelism through torch's engines: the one place that wraps a plain policy (the policy never knows).

`parallelize` takes a policy whose trained parameters are already chosen (`requires_grad`) and returns the
`Engine` (grpo.engine) that the trainer drives the same way whatever the sharding (`policies.<name>.sharding`):
`replicate` is DistributedDataParallel around a thin module whose forward is the trainer's micro-batch loss
(`LossModule`: DDP synchronises only passes through its wrapper's forward, and a MAR policy is driven through its
methods); `full_shard`, `shard_grad_op` and `hybrid_shard` are FSDP2 (`fully_shard`) on the groups the module
tree gives (`shard_units`), with the policy's interface methods registered as forward methods and the frozen
encoders left whole (`ignored_params`). Both sum gradients over processes, so N processes take the step one
process takes on the whole batch.

What the engines differ in for the trainer: when a micro-batch's gradient is reduced (DDP once, after the last
micro-batch; FSDP every micro-batch, into the shards) and, for the opt-in gradient-variance probe
(grpo.grad_stats), where a process's own gradient can be read (DDP's communication hook; FSDP's shards).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch import nn

from margrpo.grpo.engine import Engine, adapter_tensors, distributed
from margrpo.policy.settings import PolicySettings

# the interface methods that use the policy's own (root) parameters: FSDP must all-gather around each
FORWARD_METHODS = ("encode_prompts", "prepare_condition", "null_condition", "ar_forward", "head", "encode", "decode")


class LossModule(nn.Module):
    """A module whose forward runs the trainer's micro-batch loss (a closure), so that DDP can wrap the policy once:
    DDP synchronises only passes through its wrapper's forward, and a MAR policy is driven through its methods."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, loss: Callable[[], tuple[torch.Tensor, dict]]):
        return loss()


class DDPEngine(Engine):
    def __init__(self, policy: nn.Module, device: torch.device, precision: str):
        super().__init__(policy, device, precision)
        from torch.nn.parallel import DistributedDataParallel

        ids = None if device.type == "cpu" else [device.index]
        # broadcast_buffers off: the policies' buffers are constants, and a broadcast per forward costs time;
        # init_sync off: `parallelize` has broadcast the weights once already
        self.ddp = DistributedDataParallel(
            LossModule(policy), device_ids=ids, broadcast_buffers=False, init_sync=False
        )
        self.observers: list[tuple[set[int], Callable]] = []
        self.ddp.register_comm_hook(None, self._sum_hook)

    def forward(self, loss: Callable[[], tuple[torch.Tensor, dict]]) -> tuple[torch.Tensor, dict]:
        return self.ddp(loss)

    def sync(self, enabled: bool):
        return nullcontext() if enabled else self.ddp.no_sync()

    def observe_local_gradients(self, params: list[nn.Parameter], observer: Callable) -> None:
        self.observers.append(({id(p) for p in params}, observer))  # the last micro-batch's, in the hook

    def _sum_hook(self, _, bucket):  # no return annotation: DDP checks it against Future[Tensor], and ours is a string
        """Sum (not average) the bucket over processes, after showing the observers its local gradients."""
        for ids, fn in self.observers:
            for p, g in zip(bucket.parameters(), bucket.gradients()):
                if id(p) in ids:
                    fn(p, g)
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


class FSDPEngine(Engine):
    collective_forward = True
    reduces_each_micro_batch = True  # the shards hold the sum; no micro-batch's whole gradient outlives its backward
    # a chunked replay's chunks accumulate this process's whole gradient and the last reduce-scatters it (one
    # collective per micro-batch). True: every chunk reduce-scatters, so the gradients stay sharded between chunks
    # (docs/findings.md, benchmarks/chunk_reduction.py)
    reduce_each_chunk = False

    def __init__(
        self,
        policy: nn.Module,
        sharding: str,
        head_params: set[int],
        mixed_precision: str,
        device: torch.device,
    ):
        super().__init__(policy, device, mixed_precision)
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

        # the main process's plain twin of the policy on the meta device, for writing checkpoints (`save_policy`)
        self.skeleton = meta_twin(policy) if self.is_main else None
        self.mesh = fsdp_mesh(sharding, self.world, device)
        if self.is_main:
            logging.getLogger(__name__).info("%s over a device mesh of shape %s", sharding, tuple(self.mesh.shape))
        # mixed precision once, by the trainer's autocast as under DDP: FSDP gathers the float32 parameters and
        # reduces float32 gradients. Its own MixedPrecisionPolicy (bf16 parameters, no autocast) fails on the policies'
        # float32 buffers (a layer norm on CPU: "mixed dtype (CPU): expect parameter to have scalar type of Float"),
        # and with autocast on top it would round twice (docs/real-scale.md, "Mixed precision")
        self.kwargs = dict(
            mesh=self.mesh,
            reshard_after_forward=sharding in ("full_shard", "hybrid_shard"),
            mp_policy=MixedPrecisionPolicy(),
        )
        self.units = shard_units(policy, head_params)
        ignored = outside_units(policy, head_params)
        methods = root_methods(policy, self.units, head_params)
        for unit in self.units:
            fully_shard(unit, **self.kwargs)
        fully_shard(policy, **self.kwargs, ignored_params=ignored)
        for name in methods:
            register_fsdp_forward_method(policy, name)
        for module in [*self.units, policy]:
            # sum, not mean: each process's loss is its share of the batch loss (gloo has no pre-multiplied sum)
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
        self.policy = policy

    def sync(self, enabled: bool):
        @contextmanager
        def block():
            self.policy.set_requires_gradient_sync(enabled)
            # the root always reduces: its methods' inputs can carry gradients back mid-backward, which reduces it in
            # parts, and the parts of chunks accumulated locally would not be one gradient
            self.policy.set_requires_gradient_sync(True, recurse=False)
            try:
                yield
            finally:
                self.policy.set_requires_gradient_sync(True)

        return block()

    def reduces(self, last_micro_batch: bool, last_chunk: bool) -> bool:
        """Every micro-batch, into the shards (its last chunk; every chunk with `reduce_each_chunk`)."""
        return last_chunk or self.reduce_each_chunk

    def release_gathered(self) -> None:
        """Back to the shards: `shard_grad_op` keeps a group's gathered weights after its forward until its backward,
        which a step given up never runs."""
        for module in [*self.units, self.policy]:
            module.reshard()

    def shard_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Each shard once: under `hybrid_shard` every shard is held by one process on each node (the replicas)."""
        return self.all_sum(x) / (self.mesh.shape[0] if self.mesh.ndim == 2 else 1)

    def save_policy(self, module: nn.Module, write: Callable[[nn.Module], None]) -> None:
        """torch's full state dict (gathered group by group into the main process's CPU memory), assigned to the
        meta twin that `write` then saves; the twin goes back to the meta device after."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        adapters = self.full_tensors(adapter_tensors(module))  # LoRA: left out of the state dict (policy.lora)
        if not self.is_main:
            return
        buffers = {k: v.detach().cpu() for k, v in module.named_buffers() if k not in state}  # non-persistent
        self.skeleton.load_state_dict(state, assign=True)
        for name, value in buffers.items():
            owner, _, leaf = name.rpartition(".")
            self.skeleton.get_submodule(owner)._buffers[leaf] = value
        for name, value in adapters.items():
            owner, _, leaf = name.rpartition(".")
            self.skeleton.get_submodule(owner)._parameters[leaf] = nn.Parameter(value, requires_grad=False)
        try:
            write(self.skeleton)
        finally:
            self.skeleton.to("meta")


def build_policy(load: Callable[[], nn.Module], sharding: str) -> nn.Module:
    """This process's policy before `parallelize`. Sharded over several processes (FSDP), the main process alone
    builds it and reads its weights (`load`); the others receive its structure with every parameter on the meta
    device (`meta_twin`; buffers, which are small and partly not saved, travel whole) and get only their shards of
    the weights when the engine is built. Otherwise every process runs `load`."""
    if not distributed() or sharding == "replicate":
        return load()
    if dist.get_rank() == 0:
        policy = load()
        dist.broadcast_object_list([meta_twin(policy, keep_buffers=True)], src=0)
        return policy
    box = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def parallelize(
    policy: nn.Module,
    settings: PolicySettings,
    mixed_precision: str,
    head_params: list[nn.Parameter],
    device: torch.device,
    reference: nn.Module | None = None,
) -> Engine:
    """The engine for this process: plain with one process, else DDP (`replicate`) or FSDP2 (the shardings), with
    the KL `reference` (which shares the policy's frozen parameters) sharded as the policy is. Every process starts
    from the main process's weights: DDP's are broadcast whole; under FSDP each process receives its shards after
    sharding (the others' parameters may be on the meta device, `build_policy`)."""
    sharding = settings.sharding  # checked by PolicySettings
    if not distributed():
        return Engine(policy, device, mixed_precision)
    if sharding == "replicate":
        if any(t.is_meta for t in policy.parameters()):
            raise ValueError("replicate (DDP) needs the whole policy on every process: build it with build_policy")
        for t in [*policy.parameters(), *policy.buffers()]:  # the one broadcast: LoRA adapters start at random
            dist.broadcast(t.data, src=0)
        return DDPEngine(policy, device, mixed_precision)
    modules = [policy] + ([reference] if reference is not None and reference is not policy else [])
    # the main process's whole weights, kept beside the sharded modules until every process has its shards
    sources = (
        [copy_with_tensors(m, lambda t: t.detach()) for m in modules]
        if dist.get_rank() == 0
        else [None] * len(modules)
    )
    engine = FSDPEngine(policy, sharding, {id(p) for p in head_params}, mixed_precision, device)
    if len(modules) > 1:
        _shard_reference(reference, engine)
    for module in modules:
        materialize(module, device)
    for module, source in zip(modules, sources):
        engine.load_policy_state(module, source)
    return engine


def materialize(module: nn.Module, device: torch.device) -> None:
    """Storage on `device` for the module's tensors on the meta device (FSDP's shards stay shards; the values are
    undefined until loaded). Parameters shared with another module change in place, so stay shared."""
    module._apply(lambda t: torch.empty_like(t, device=device) if t.is_meta else t)


def _shard_reference(ref: nn.Module, engine: FSDPEngine) -> None:
    """The KL reference sharded as the policy is (resharded after each no-grad forward)."""
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

    def inside(m, ids):
        return bool(list(m.parameters())) and all(id(p) in ids for p in m.parameters())

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


def fsdp_mesh(sharding: str, world: int, device: torch.device):
    """FSDP's device mesh: every process one shard (`full_shard`, `shard_grad_op`), or for `hybrid_shard` (HSDP)
    a 2-D mesh of nodes x processes per node: shards within a node, replicas across nodes, so that the per-block
    all-gathers stay on the node's fast links and only the gradients' all-reduce crosses nodes."""
    import os

    from torch.distributed.device_mesh import init_device_mesh

    if sharding != "hybrid_shard":
        return init_device_mesh(device.type, (world,))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # torchrun's processes on this node
    if world % per_node:
        raise ValueError(f"hybrid_shard: {world} processes are not whole nodes of {per_node}")
    return init_device_mesh(device.type, (world // per_node, per_node), mesh_dim_names=("replicate", "shard"))


def copy_with_tensors(
    module: nn.Module, tensor: Callable[[torch.Tensor], torch.Tensor], buffers: bool = True
) -> nn.Module:
    """A copy of `module` (its structure and settings: tokenizers, configs) whose parameters are `tensor(p)`, and
    whose buffers too unless `buffers` is False (then kept as they are)."""
    memo = {}
    for t in [*module.parameters(), *(module.buffers() if buffers else ())]:
        new = tensor(t)
        memo[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
    return copy.deepcopy(module, memo)


def meta_twin(module: nn.Module, keep_buffers: bool = False) -> nn.Module:
    """A copy of `module` without a byte of its weights: parameters (and buffers, unless `keep_buffers`) on the
    meta device."""
    return copy_with_tensors(module, lambda t: torch.empty_like(t, device="meta"), buffers=not keep_buffers)
