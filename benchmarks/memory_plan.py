"""Per-GPU memory plan of one GRPO step of NOVA-0.6B / Harmon-1.5B, computed on a CPU with fake tensors (no GPU).

How. The real trainer (`GRPOTrainer.train_step`: rollout_and_score, plan_updates, update with micro_backward in
`grpo.replay_chunk` chunks) takes one step of ONE process on the full-size policy (random init) under torch's
`FakeTensorMode` on a fake `cpu` device: every tensor has its shape and dtype, none its memory. A dispatch mode
(`Ledger`) adds up the bytes of the live tensor storages by kind (weights, reference copy, gradients, AdamW
state, autocast's weight copies, the rollout record, activations) and keeps each phase's peak: rollout (generate
under no_grad, the reward, the MTE / Sim masks), replay (forward + backward of every micro-batch and chunk, the
KL reference's pass) and optimizer (clip + AdamW). The step is a steady-state one: gradients and AdamW state of
the last step exist from its start (the trainer frees the gradients only when the replay begins). The |M| chosen
AR steps are the worst case, the first |M| (they predict the most tokens); the rollout stops after them and the
record of the other AR steps is added exactly (`instrumented`: a rollout's peak is at its first step).

Data-dependent values (a `.item()`, `nonzero`, a boolean index, `tolist`) have no value on fake tensors. They
depend on the schedule, the seeds and the masks, not on the width of the networks, so they come from a `Tape`:
the same step is first run for real on a *narrow* twin of the policy (same depths, sequence lengths, token dim,
schedule, batch and seeds; widths 8-32), recording each such result in order; the fake full-size step replays
them, each op and the kind of each value checked against the recorded one.

What follows the GPU rather than this CPU: attention takes `scaled_dot_product_attention` (the CUDA branch of
`margrpo.policy.layers.Attention`); `margrpo.policy.invariant`'s row blocks (CPU tensors only) are left out; AdamW
runs `foreach` (CUDA's default: its update temporaries are counted); autocast follows CUDA's policy (`CudaAutocast`:
matmuls in bf16; layer / group norm, softmax, exp, log, pow and the like in fp32) instead of the CPU's (which keeps
norms and softmax in bf16), switched in where the trainer opens its autocast. What fake tensors cannot show: the
CUDA context, kernels' workspaces (cuBLAS, SDPA's backward, cuDNN's convolutions; the CPU's differ and are not
counted either), NCCL's buffers and the caching allocator's unused reserve. They get ALLOWANCE_FIXED plus
ALLOWANCE_SHARE of the tensor peak (not measured; see there). The scorers' activations are not planned: they come
and go inside the rollout phase (no gradients), whose peak the table shows is far below the replay's.

Per GPU, from the one-process measurement and parameter counts (N processes, one prompt group never split):
- the batch per GPU is `--prompts-per-gpu` x group_size images (1 x 4 in the official runs), one micro-batch,
  one chosen AR step per backward; `old`: 3 x 4 images on one GPU, 2 micro-batches, all |M| steps at once (the
  H200 run that ran out of memory, docs/real-scale.md);
- N = 1: nothing is wrapped (the measurement as is);
- replicate (DDP, N > 1): the measurement plus DDP's gradient buckets (one fp32 copy of the trained gradients);
- full_shard (FSDP2, reshard_after_forward=True, ZeRO-3): the parameters FSDP manages (the AR and the head,
  trained or frozen, and the reference's copy) are stored 1/N in fp32; gradients and AdamW state 1/N; the frozen
  encoders outside the AR and the head (text encoder, VAE) and all buffers stay whole on every GPU. Transient:
  the root group's unsharded bf16 parameters while it runs plus two block groups (the one running and the one
  prefetched), the reference's as much in the replay, and one group's unsharded gradient (bf16, then fp32 for
  the reduce-scatter). No autocast weight copies (FSDP all-gathers bf16 parameters). In a chunked replay the
  chunks before the last run without gradient sync (`FSDPEngine.reduce_each_chunk` False), and FSDP2 keeps their
  gradients unsharded, accumulated in fp32, until the last chunk reduces them: during the replay the gradients are
  whole (reducing every chunk would not lower the peak while the gradient statistic keeps its own whole copy:
  benchmarks/chunk_reduction.py);
- shard_grad_op (FSDP2, reshard_after_forward=False, ZeRO-2): as full_shard, but the policy's FSDP parameters stay
  gathered in bf16 for the whole step; the reference reshards after each forward.
  Both FSDP shardings also hold, during the replay's backward, one fp32 copy of this process's local (unreduced)
  gradient of the parameters the micro-batch gradient statistic reads (`grpo.parallel.LocalSquares`: the AR's
  trained parameters; the head's for head-only).
FSDP groups are `margrpo.grpo.parallel.shard_units` (every block of an nn.ModuleList made of AR / head
parameters, then the children of each largest head-only module) and the root (the rest of the AR and the head).
Reward models' weights (per `reward_models.<name>.dtype`, float32 by default) are whole on every GPU; their
parameter counts come from their architectures built on the meta device (`reward_weights`).

    python benchmarks/memory_plan.py [--config config/paper-nova.yaml ...] [--variants grpo,fix,mte,sim,head]
        [--gpus 1 3 8] [--old-variants LIST] [--reward mixed] [--prompts-per-gpu 1] [--sharding MODE]
        [--rollout-steps N] [--validate] [--gpu-check] [--json OUT] [--test]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import resource
import sys
import tempfile
import time
import weakref
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map_only

sys.path.insert(0, str(Path(__file__).parent))
from real_scale import PROMPTS, brightness, stand_in_tokenizer  # noqa: E402

from margrpo.infra.kernels import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
LIMITS = {"80 GiB": 80 * GiB, "139 GiB": 139 * GiB}  # H100 80 GB, and the H200 the paper batch ran out of memory on
# Not measured (no GPU here). The CUDA context takes ~0.5-0.7 GiB on Hopper (CUDA 12+, lazy module loading); cuBLAS /
# cuBLASLt workspaces 32 MiB a handle and stream; SDPA's backward and cuDNN's convolutions (the VAE) take workspace
# through the caching allocator; NCCL's buffers some hundred MiB with N > 1: a fixed 2 GiB covers them with room. The
# caching allocator keeps freed and split blocks reserved: 10% of the tensor peak (fragmentation of a training step
# with changing shapes is commonly 5-15%).
ALLOWANCE_FIXED, ALLOWANCE_SHARE = 2 * GiB, 0.10


# --- the ledger: live storage bytes by kind, each phase's peak ------------------------------------------------------
def _storages(t: torch.Tensor) -> list:
    return [t.untyped_storage()] if t.layout == torch.strided and not t.is_nested else []


CASTS = {torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout}


class Ledger(TorchDispatchMode):
    """Bytes of the live tensor storages by kind and each phase's peak with its split by kind (fake or real tensors:
    the same code counts both, which is what the small-size validation compares)."""

    def __init__(self):
        super().__init__()
        self.info: dict[int, list] = {}  # id(storage) -> [bytes, kind, weakref]
        self.now: Counter = Counter()
        self.phase, self.default = "setup", "act"
        self.peaks: dict[str, tuple[int, dict]] = {}
        self.weights: set[int] = set()  # storages of weights (autocast's copies of them are "cast")
        self.t0 = time.perf_counter()

    def total(self) -> int:
        return sum(self.now.values())

    def track(self, t: torch.Tensor, kind: str, retag: bool = False) -> None:
        for st in _storages(t):
            entry = self.info.get(id(st))
            if entry is None:
                entry = [st.nbytes(), kind, None]
                entry[2] = weakref.ref(st, partial(self._free, id(st)))
                self.info[id(st)] = entry
                self.now[kind] += entry[0]
            elif retag and entry[1] != kind:
                self.now[entry[1]] -= entry[0]
                self.now[kind] += entry[0]
                entry[1] = kind

    def _free(self, key: int, _ref) -> None:
        entry = self.info.pop(key, None)
        if entry is not None:
            self.now[entry[1]] -= entry[0]

    def retag(self, tensors, kind: str) -> None:
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self.track(t, kind, retag=True)

    def phantom(self, kind: str, nbytes: int) -> None:
        """Bytes no tensor holds here but the real step does (the AR steps a shortened rollout skipped)."""
        self.now[kind] += nbytes
        self.note()

    def set_phase(self, phase: str, default: str = "act") -> None:
        if VERBOSE and self.phase in ("rollout", "replay", "optimizer"):
            print(
                f"      {self.phase}: peak {self.peaks[self.phase][0] / GiB:.2f} GiB "
                f"({time.perf_counter() - self.t0:.0f} s)",
                flush=True,
            )
        self.phase, self.default = phase, default
        self.note()

    def note(self) -> None:
        total = self.total()
        if total > self.peaks.get(self.phase, (-1,))[0]:
            self.peaks[self.phase] = (total, {k: v for k, v in self.now.items() if v})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        kind = self.default
        if func in CASTS and isinstance(args[0], torch.Tensor) and id(args[0].untyped_storage()) in self.weights:
            kind = "cast"
        tree_map_only(torch.Tensor, lambda t: self.track(t, kind), out)
        self.note()
        return out


# --- the tape: data-dependent results, recorded on a narrow real run and replayed on the fake one --------------------
INDEX_OPS = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put.default,
    torch.ops.aten.index_put_.default,
    torch.ops.aten._index_put_impl_.default,
}
DYNAMIC = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)
_DYNAMIC: dict = {}  # op -> whether it is tagged DYNAMIC


def _bool_indices(func, args) -> list[int]:
    return (
        [i for i, x in enumerate(args[1]) if isinstance(x, torch.Tensor) and x.dtype == torch.bool]
        if func in INDEX_OPS
        else []
    )


class Tape(TorchDispatchMode):
    """Records (`values` None) or replays the results of the data-dependent ops of a step, in order."""

    def __init__(self, values: list | None = None):
        super().__init__()
        self.recording = values is None
        self.values = [] if values is None else values
        self.queue = deque(self.values)

    def pop(self, name: str):
        if not self.queue:
            raise RuntimeError(f"tape: {name} has no recorded result (the fake step took another path)")
        got, value = self.queue.popleft()
        if got != name:
            raise RuntimeError(f"tape: {name} where {got} was recorded (the fake step took another path)")
        return value

    @staticmethod
    def kind(x) -> str:
        """A scalar's kind, checked on replay (a misaligned tape hands out a loss where a step count was read)."""
        return "bool" if x.dtype == torch.bool else "float" if x.is_floating_point() else "int"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dynamic = _DYNAMIC.get(func)
        if dynamic is None:
            dynamic = _DYNAMIC[func] = any(t in func.tags for t in DYNAMIC)
        bools = _bool_indices(func, args) if dynamic else []
        if not dynamic or func in INDEX_OPS and not bools:
            return func(*args, **kwargs)
        name = str(func)
        if self.recording:
            if bools:  # the count of each boolean index
                self.values.append((name, [int(args[1][i].sum()) for i in bools]))
                return func(*args, **kwargs)
            out = func(*args, **kwargs)
            if func is torch.ops.aten._local_scalar_dense.default:
                self.values.append((name, (self.kind(args[0]), out)))
            else:
                self.values.append(
                    (name, [(tuple(t.shape), t.dtype) for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
                )
            return out
        value = self.pop(name)
        if func is torch.ops.aten._local_scalar_dense.default:
            if value[0] != self.kind(args[0]):
                raise RuntimeError(f"tape: a {self.kind(args[0])} read where a {value[0]} was recorded (another path)")
            return value[1]
        if bools:  # each boolean index becomes its count of (zero) long indices, one per dimension it spans
            indices = []
            for i, x in enumerate(args[1]):
                if i in bools:
                    n = value[bools.index(i)]
                    indices += [torch.zeros(n, dtype=torch.long, device=x.device)] * x.dim()
                else:
                    indices.append(x)
            return func(args[0], indices, *args[2:], **kwargs)
        outs = [torch.zeros(shape, dtype=dtype, device=args[0].device) for shape, dtype in value]
        if func in (torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default) and len(outs) == 1:
            return outs[0]
        if func is torch.ops.aten._unique2.default:
            return tuple(outs)
        raise RuntimeError(f"tape: no replay rule for {name}")


def _items(t: torch.Tensor):
    return t.item() if t.dim() == 0 else [_items(e) for e in t]


def _cheap_attention(q, k, v, *args, **kwargs):
    return q + 0 * (k.mean() + v.mean())


@contextlib.contextmanager
def recording(cheap: bool):
    """While a real run records the tape: `Tensor.tolist` (which reads memory without dispatching) takes one `.item()`
    per element, as a fake tensor's `tolist` does, so both steps put the same entries on the tape. `cheap` (the narrow
    run): attention is q + 0 (k, v), which keeps every gradient: attention decides nothing data-dependent, and its
    S^2 work at 1,000+ positions is what made that run slow. Patched functions rather than modes: a mode costs every
    op."""
    F, tolist, sdpa = torch.nn.functional, torch.Tensor.tolist, torch.nn.functional.scaled_dot_product_attention
    torch.Tensor.tolist, F.scaled_dot_product_attention = _items, _cheap_attention if cheap else sdpa
    try:
        yield
    finally:
        torch.Tensor.tolist, F.scaled_dot_product_attention = tolist, sdpa


# --- CUDA's autocast policy on CPU tensors ---------------------------------------------------------------------------
def _fns(*names: str) -> set:
    """torch functions and Tensor methods by name (those that exist)."""
    F = torch.nn.functional
    return {getattr(owner, n) for n in names for owner in (torch, torch.Tensor, F, torch.linalg) if hasattr(owner, n)}


# aten/src/ATen/autocast_mode.cpp, the CUDA lists (the promote list is left to type promotion)
LOW = _fns(
    "linear",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "prelu",
    "scaled_dot_product_attention",
    "matmul",
    "__matmul__",
    "__rmatmul__",
    "mm",
    "bmm",
    "baddbmm",
    "addmm",
    "addbmm",
    "mv",
    "addmv",
    "addr",
    "einsum",
    "chain_matmul",
    "multi_dot",
    "vecdot",
)
FP32 = _fns(
    "layer_norm",
    "group_norm",
    "softplus",
    "cosine_similarity",
    "interpolate",
    "exp",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "reciprocal",
    "rsqrt",
    "acos",
    "asin",
    "cosh",
    "sinh",
    "tan",
    "erfinv",
    "pow",
    "__pow__",
    "__rpow__",
    "logsumexp",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "kl_div",
    "nll_loss",
    "binary_cross_entropy_with_logits",
    "cdist",
    "dist",
    "renorm",
    "pdist",
)
FP32_OUT = _fns("softmax", "log_softmax", "sum", "cumsum", "prod", "cumprod", "vector_norm", "matrix_norm")
AUTOCAST = LOW | FP32 | FP32_OUT


class CudaAutocast(TorchFunctionMode):
    """Where CPU autocast is on (the trainer's regions), apply CUDA's policy instead of the CPU's, with its cache of
    the low-precision copies of leaf weights that require grad (kept until the region ends: `clear`)."""

    def __init__(self):
        super().__init__()
        self.cache: dict[int, torch.Tensor] = {}

    def cast(self, x, dtype: torch.dtype, cache: bool):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype in (dtype, torch.float64):
            return x
        if cache and x.dtype == torch.float32 and x.requires_grad and x.is_leaf and not x._is_view():
            if id(x) not in self.cache:
                self.cache[id(x)] = x.to(dtype)
            return self.cache[id(x)]
        return x.to(dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in AUTOCAST or not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        low = torch.get_autocast_dtype("cpu")
        if func in LOW or func in FP32:
            dtype = low if func in LOW else torch.float32
            args, kwargs = tree_map_only(torch.Tensor, lambda x: self.cast(x, dtype, func in LOW), (args, kwargs))
        elif (
            "dtype" not in kwargs
            and isinstance(args[0], torch.Tensor)
            and args[0].is_floating_point()
            and args[0].dtype != torch.float64
        ):
            kwargs = {**kwargs, "dtype": torch.float32}
        with torch.autocast("cpu", enabled=False):
            return func(*args, **kwargs)

    def clear(self) -> None:
        self.cache.clear()


# --- the policies: full size, their narrow twins (the tape), and small / tiny ones (validation, --test) -------------
def _phi(hidden: int, layers: int, heads: int, vocab: int, positions: int, rotary: float):
    from transformers import PhiConfig, PhiModel

    config = PhiConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        partial_rotary_factor=rotary,
        max_position_embeddings=positions,
    )
    config._attn_implementation = "sdpa"
    return PhiModel(config)


def _sd_vae(channels: tuple[int, ...], layers: int, groups: int, size: int):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        latent_channels=4,
        block_out_channels=channels,
        layers_per_block=layers,
        norm_num_groups=groups,
        sample_size=size,
    )


def build_nova(size: str, narrow: bool):
    """NOVA at `size` (full: nova-d48w1024-sd512 with Phi-2 and the SD VAE; small: memory_levers.py's; tiny: the
    tests'); `narrow`: the same depths, lengths and token dim at widths 8-32."""
    from margrpo.policy.nova import NovaConfig, NovaPolicy

    if size == "full":
        wide = dict(width=1024, num_heads=16, head_width=1280, text_token_dim=2560)
        config = NovaConfig(**(dict(width=16, num_heads=2, head_width=8, text_token_dim=16) if narrow else wide))
        phi = _phi(16, 32, 2, 51200, 2048, 0.5) if narrow else _phi(2560, 32, 32, 51200, 2048, 0.4)
        vae = _sd_vae((8,) * 4 if narrow else (128, 256, 512, 512), 2, 4 if narrow else 32, 512)
    else:
        px, width, depth = (128, 128, 4) if size == "small" else (64, 32, 2)
        grid = px // 16
        config = NovaConfig(
            image_size=(px, px),
            text_token_dim=16,
            text_token_len=8,
            video_base_size=(1, grid // 2, grid // 2),
            image_base_size=(grid, grid),
            width=16 if narrow else width,
            num_heads=4,
            video_depth=1,
            image_depth=depth,
            head_depth=2,
            head_width=16 if narrow else width,
            flow_shift=1.5,
        )
        phi = _phi(16, 1, 2, 64, 16, 0.5)
        vae = _sd_vae((8,) * 4, 1, 4, px)
    return NovaPolicy(config, phi, vae, stand_in_tokenizer())


def build_harmon(size: str, narrow: bool):
    """Harmon at `size` (full: Harmon-1.5B = Qwen2.5-1.5B + MAR-H + KL-16; tiny: the tests'); `narrow` as for NOVA."""
    from margrpo.policy.harmon import HarmonConfig, HarmonPolicy

    if size == "full" and not narrow:
        return HarmonPolicy(HarmonConfig(), stand_in_tokenizer())
    full = size == "full"
    w = 32 if full else (16 if narrow else 32)
    llm = dict(
        HarmonConfig().llm, hidden_size=w, intermediate_size=2 * w, num_attention_heads=4, num_key_value_heads=2
    )
    if not full:
        llm.update(vocab_size=64, num_hidden_layers=2, max_position_embeddings=256)
    mar = dict(
        encoder_width=w,
        encoder_heads=4,
        decoder_width=w,
        decoder_heads=4,
        head_width=w,
        vae_channels=(8, 8, 16, 16, 32) if full else (8, 8, 16),
        vae_norm_groups=4,
    )
    if not full:
        mar.update(
            encoder_depth=1,
            decoder_depth=1,
            buffer_size=4,
            num_classes=10,
            pos_embed_size=16,
            image_size=32,
            head_depth=2,
            vae_layers_per_block=1,
            vae_latent_channels=4,
        )
    return HarmonPolicy(HarmonConfig(llm=llm, **mar), stand_in_tokenizer())


BUILD = {"nova": build_nova, "harmon": build_harmon}


# --- one step of one process, fake or real ---------------------------------------------------------------------------
# the schedule of the small / tiny policies (the full ones run the configs' own)
SCHEDULES = {
    "full": ({}, {}),
    "small": ({"ar_steps": 8, "diffusion_steps": 6}, {"mask_steps": 4, "diffusion_steps": 4}),
    "tiny": ({"ar_steps": 4, "diffusion_steps": 5}, {"mask_steps": 2, "diffusion_steps": 3}),
}


@dataclass(frozen=True)
class Run:
    """One process's step: the policy, variant and size, and the batch it takes (prompt groups on this GPU)."""

    policy: str
    variant: str
    size: str = "full"
    prompts: int = 1  # prompt groups on this GPU, group_size images each
    micro_batches: int = 1
    replay_chunk: int | None = 1
    reward: str = "mixed"
    config_path: Path | None = None  # default: config/paper-<policy>.yaml
    chosen: str = "first"  # the |M| chosen AR steps: the first (the most tokens: the worst case) or as drawn

    def config(self) -> dict:
        from margrpo.experiment.config import load_config

        return load_config(self.config_path or ROOT / "config" / f"paper-{self.policy}.yaml")

    def label(self) -> str:
        chunk = "all" if self.replay_chunk is None else self.replay_chunk
        return f"{self.prompts} x G images, micro_batches {self.micro_batches}, replay_chunk {chunk}"


def make_trainer(run: Run, policy, out: str, precision: str | None = None):
    """The real trainer as the train stage builds it from the paper config, with this run's batch on one process."""
    from accelerate import Accelerator

    from margrpo.experiment.config import train_spec
    from margrpo.grpo.rollout import SamplingConfig
    from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
    from margrpo.prompts.suites import PromptSet

    spec = train_spec(run.config(), run.policy, run.reward, run.variant)
    sampling, grpo = SCHEDULES[run.size]
    spec["grpo"] = {k: v for k, v in spec["grpo"].items() if k != "sharding"}  # one process: nothing to shard
    spec["grpo"].update(
        grpo, batch_prompts=run.prompts, micro_batches=run.micro_batches, replay_chunk=run.replay_chunk, trackers=[]
    )
    prompts = PromptSet(PROMPTS, [{}] * len(PROMPTS))
    cfg = GRPOConfig.from_spec(spec, precision=precision or spec["mixed_precision"])
    return GRPOTrainer(
        policy,
        brightness,
        prompts,
        prompts,
        SamplingConfig(**{**spec["sampling"], **sampling}),
        cfg,
        out,
        Accelerator(cpu=True),
    )


def warm(trainer) -> None:
    """A later step's state: last step's gradients and AdamW's moments exist; AdamW runs foreach (CUDA's default)."""
    for p in trainer.params:
        p.grad = torch.zeros_like(p)
        trainer.optimizer.state[p] = {
            "step": torch.tensor(0.0),
            "exp_avg": torch.zeros_like(p),
            "exp_avg_sq": torch.zeros_like(p),
        }
    for group in trainer.optimizer.param_groups:
        group["foreach"] = True


def register(ledger: Ledger, trainer) -> None:
    """What exists before the step, by kind: the policy's trained parameters, the FSDP-managed frozen ones (AR /
    head), the encoders outside them, buffers, the reference's own copies, gradients and AdamW state."""
    policy, ref = trainer.policy, trainer.ref
    model = {id(p) for p in policy.ar_parameters()} | {id(p) for p in policy.head_parameters()}
    for p in policy.parameters():
        ledger.track(p, "trained" if p.requires_grad else "frozen" if id(p) in model else "encoders")
    for b in policy.buffers():
        ledger.track(b, "buffers")
    for t in [] if ref is None or ref is policy else [*ref.parameters(), *ref.buffers()]:
        ledger.track(t, "reference" if isinstance(t, torch.nn.Parameter) else "buffers")  # shared parts: counted above
    # autocast's bf16 copies of these are "cast": FSDP gathers them in bf16 instead (the encoders stay fp32 there too)
    ledger.weights = {k for k, (_, kind, _) in ledger.info.items() if kind in ("trained", "frozen", "reference")}
    for p in trainer.params:
        ledger.track(p.grad, "grad")
        ledger.retag(list(trainer.optimizer.state[p].values()), "optim")
        p.register_post_accumulate_grad_hook(lambda q: ledger.retag(q.grad, "grad"))


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _per_step(r) -> list:
    """A rollout's tensors with one entry per AR step (the record's size grows with K)."""
    return [r.known, r.committed, r.states, r.log_probs]


@contextlib.contextmanager
def instrumented(ledger: Ledger, trainer, amp: CudaAutocast, steps: int | None, chosen: str = "first"):
    """The step as the plan takes it, around the trainer's own code:
    - the ledger's phases: rollout (rollout_and_score), replay (backward), optimizer (clip and AdamW);
    - CUDA's autocast policy where the trainer opens autocast;
    - `chosen` "first": the worst case of the |M| chosen AR steps for memory, the first |M|, which predict the most
      tokens (the trainer draws them at random; over a run every one is drawn). Its diffusion steps are the
      trainer's draw (all hold the same number of rows). "drawn": the trainer's own draw;
    - `steps`: the rollout stops after that many AR steps of the configured schedule (at least |M|). Its peak does
      not depend on later steps (step 0 predicts every token; the AR's transients are the same at every step); the
      record of the missing steps, and of their copies, is added to the ledger exactly (`phantom`);
    - CPU-only code takes its CUDA branch: `margrpo.policy.invariant.batch_invariant` (fixed row blocks for F.linear
      on CPU tensors; CUDA tensors pass through it untouched), where that module exists, is left out."""
    import importlib

    import margrpo.grpo.rollout as rollout_module
    import margrpo.grpo.trainer as module

    blocks = []  # (module, name, value) of batch_invariant wherever it was imported
    for name in ("margrpo.policy.invariant", "margrpo.policy.base", "margrpo.policy.memory"):
        try:
            owner = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(owner, "batch_invariant"):
            blocks.append((owner, owner.batch_invariant))

    # a checkpointed block recomputes in backward under CUDA's policy too (torch restores CPU autocast there, and with
    # it the CPU's policy, which would recompute other dtypes than the forward saved)
    import margrpo.policy.memory as memory

    forward_mode = memory.forward_mode

    def forward_mode_with_amp(block):
        before, recompute = forward_mode(block)

        @contextlib.contextmanager
        def both():
            with recompute, amp:
                yield

        return before, both()

    saved = (module.autocast, module.subset_rollout, rollout_module.ar_schedule, rollout_module._Record.empty)
    K = len(saved[2](trainer.policy, trainer.sampling))
    R = K if steps is None else max(steps, trainer.cfg.mask_steps)
    if chosen == "drawn":  # the rollout must reach the last AR step the trainer will draw
        from margrpo.grpo.streams import step_generator

        R = max(R, int(trainer.choose_steps(step_generator(trainer.cfg.seed, trainer.step, 3))[0].max()) + 1)
    rollout_and_score, backward, choose = trainer.rollout_and_score, trainer.backward, trainer.choose_steps

    def cuda_policy(device, precision):
        @contextlib.contextmanager
        def region():
            with saved[0](device, precision):
                yield
            if not torch.is_autocast_enabled("cpu"):
                amp.clear()

        return region()

    def schedule(policy, sampling):
        return saved[2](policy, sampling)[:R]

    def grow(tensors) -> None:  # the missing AR steps' share of these per-step tensors
        ledger.phantom("record", _nbytes(tensors) * (K - R) // R)

    def empty(*args, **kwargs):
        rec = saved[3](*args, **kwargs)
        grow(_per_step(rec))
        return rec

    def subset(r, rows):
        sub = saved[1](r, rows)
        grow(_per_step(sub))
        return sub

    def rollout():
        ledger.set_phase("rollout")
        batch = rollout_and_score()
        grow([batch.mte_mask, batch.sim_keep])
        kept = [batch.adv, batch.rewards, batch.mte_mask, batch.sim_keep, *batch.rows]
        kept += [v for r in [batch.rollout, *batch.subs] for v in vars(r).values() if isinstance(v, torch.Tensor)]
        ledger.retag([t for t in kept if t is not None], "record")  # lives through the replay
        ledger.set_phase("between")
        return batch

    def replay(*args):
        ledger.set_phase("replay")
        out = backward(*args)
        ledger.set_phase("optimizer", "optim")
        return out

    def worst(g):
        ar, diff = choose(g)
        return torch.arange(len(ar)), diff

    trainer.rollout_and_score, trainer.backward = rollout, replay
    if chosen == "first":
        trainer.choose_steps = worst
    trainer.optimizer.register_step_post_hook(lambda *_: ledger.set_phase("after"))
    module.autocast, module.subset_rollout, rollout_module.ar_schedule = cuda_policy, subset, schedule
    rollout_module._Record.empty = empty
    memory.forward_mode = forward_mode_with_amp
    for owner, _ in blocks:
        owner.batch_invariant = contextlib.nullcontext
    try:
        yield K, R
    finally:
        module.autocast, module.subset_rollout, rollout_module.ar_schedule = saved[:3]
        rollout_module._Record.empty = saved[3]
        memory.forward_mode = forward_mode
        for owner, value in blocks:
            owner.batch_invariant = value


@dataclass
class Step:
    """One process's step: each phase's peak bytes and its split by kind; the sizes the composition needs."""

    run: Run
    fake: bool
    peaks: dict[str, tuple[int, dict]]
    sizes: dict[str, int]
    seconds: float
    cpu_seconds: float
    ar_steps: tuple[int, int] = (0, 0)  # (K of the schedule, AR steps the rollout ran)
    start: int = 0  # bytes before the step (what it starts from)
    rss: tuple[int, int] = (0, 0)  # this process's RSS before the step and its max RSS after (bytes; real runs)
    allocated: int = 0  # real runs: the CPU allocator's peak growth over the step, from torch's profiler
    tape: list = field(default_factory=list, repr=False)

    @property
    def peak(self) -> int:
        return max(total for total, _ in self.peaks.values())


def fused_attention(policy) -> None:
    """The CUDA branch of margrpo's Attention (scaled_dot_product_attention, no materialised score matrix)."""
    from margrpo.policy.layers import Attention

    for m in policy.modules():
        if isinstance(m, Attention):
            m.fused = True


def measure(run: Run, fake: bool, narrow: bool = False, tape: list | None = None, steps: int | None = None) -> Step:
    """One steady-state step of `run` on one process: fake tensors (replaying `tape`) or real ones (recording it when
    `tape` is None). The narrow recording run skips what decides nothing: bf16 casts (slow on this CPU) and
    attention's work. `steps`: AR steps the rollout runs (None: all; `instrumented`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    t0, c0 = time.perf_counter(), time.process_time()
    torch.manual_seed(0)
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    ledger, amp, tape = Ledger(), CudaAutocast(), Tape(tape)
    cheap = narrow and not fake
    # building the policy and the trainer reads values too (the samplers' constants): the tape covers them
    with (
        mode,
        tape,
        recording(cheap) if tape.recording else contextlib.nullcontext(),
        allocator_record(not fake and not narrow) as allocated,
    ):
        policy = BUILD[run.policy](run.size, narrow)
        fused_attention(policy)
        if fake:  # the trainer's policy.to(cpu) would swap every fake parameter for itself, which torch refuses
            policy.to = partial(_itself, policy)
        with tempfile.TemporaryDirectory(prefix="memory_plan-") as out:
            trainer = make_trainer(run, policy, out, "no" if cheap else None)
        for m in {id(x): x for x in (policy, trainer.ref) if x is not None}.values():
            m.__dict__.pop("to", None)
        warm(trainer)
        register(ledger, trainer)
        sizes = group_sizes(trainer)
        start, rss = ledger.total(), _rss(reset=True)
        with (
            instrumented(ledger, trainer, amp, steps, run.chosen) as ar_steps,
            ledger,
            amp if not cheap else contextlib.nullcontext(),
            torch.profiler.record_function("step"),
        ):
            trainer.train_step()
        rss = (rss, _rss())
        del trainer, policy  # inside the record: their frees are the last events
        gc.collect()
    if tape.queue:
        raise RuntimeError(f"tape: {len(tape.queue)} recorded results left over (the fake step took another path)")
    return Step(
        run,
        fake,
        ledger.peaks,
        sizes,
        time.perf_counter() - t0,
        time.process_time() - c0,
        ar_steps,
        start,
        rss,
        allocated[0] if allocated else 0,
        tape.values,
    )


@contextlib.contextmanager
def allocator_record(enabled: bool):
    """The CPU allocator's peak growth over the part of the block marked `step` (`record_function("step")`; bytes),
    from torch's profiler memory record: every allocation and free of a tensor storage made inside the block, in
    time order, whatever made it; an account independent of the ledger's, which counts storages by the ops that
    dispatch them. The record starts before the policy is built, so that what the step frees was allocated inside
    it (a free of a storage from before the record is not reported). Yields a list that holds the peak after."""
    out = []
    if not enabled:
        yield out
        return
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield out
    events = prof.profiler.kineto_results.events()
    (mark,) = [e for e in events if e.name() == "step" and e.is_user_annotation()]
    live = peak = 0
    before = None
    for t, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"):
        if t >= mark.start_ns() and before is None:
            before = peak = live
        if t > mark.end_ns():
            break
        live += nbytes
        if before is not None:
            peak = max(peak, live)
    out.append(peak - (live if before is None else before))


def _itself(module, *args, **kwargs):
    return module


def _rss(reset: bool = False) -> int:
    """Bytes: with `reset`, the resident set now, after resetting the peak (Linux: /proc/self/clear_refs); else the
    peak resident set since (VmHWM). Without /proc, the process's max RSS (which never resets)."""
    try:
        if reset:
            Path("/proc/self/clear_refs").write_text("5")
        status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        return int(status["VmRSS" if reset else "VmHWM"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _shard_units(policy, head: set[int]) -> list:
    """The FSDP groups below the root as the trainer forms them (`margrpo.grpo.parallel.shard_units`); without that
    module, the same rule: each element of an nn.ModuleList made only of AR / head parameters."""
    try:
        from margrpo.grpo.parallel import shard_units
    except ImportError:
        model = head | {id(p) for p in policy.ar_parameters()}
        inside = lambda m: bool(list(m.parameters())) and all(id(p) in model for p in m.parameters())  # noqa: E731
        return [b for m in policy.modules() if isinstance(m, torch.nn.ModuleList) for b in m if inside(b)]
    return shard_units(policy, head)


def group_sizes(trainer) -> dict[str, int]:
    """Bytes (fp32) the composition needs: the FSDP-managed parameters (AR and head) and their trained part, the
    root group and the largest block group (all, trained), the reference's own copy, everything else."""
    policy = trainer.policy
    head = {id(p) for p in policy.head_parameters()}
    model = head | {id(p) for p in policy.ar_parameters()}
    units, taken, own = _shard_units(policy, head), set(), []
    for unit in units:  # innermost first: a group owns what no group inside it took
        mine = [p for p in unit.parameters() if id(p) not in taken]
        taken |= {id(p) for p in mine}
        own.append(mine)
    nbytes = lambda ps: sum(p.numel() * p.element_size() for p in ps)  # noqa: E731
    trained = lambda ps: [p for p in ps if p.requires_grad]  # noqa: E731
    params = list(policy.parameters())
    root = [p for p in params if id(p) in model and id(p) not in taken]
    ref = (
        []
        if trainer.ref is None or trainer.ref is policy
        else [p for p in trainer.ref.parameters() if not any(p is q for q in params)]
    )
    return {
        "fsdp": nbytes([p for p in params if id(p) in model]),
        "fsdp_trained": nbytes(trained(params)),
        "root": nbytes(root),
        "root_trained": nbytes(trained(root)),
        "unit": max(map(nbytes, own), default=0),
        "unit_trained": max((nbytes(trained(ps)) for ps in own), default=0),
        "groups": len(own) + 1,
        "reference": nbytes(ref),
        "trained": nbytes(trained(params)),
        "mask_steps": trainer.cfg.mask_steps,
        "frozen": nbytes([p for p in params if not p.requires_grad]),
        "buffers": nbytes(list(policy.buffers())),
        "stat": sum(p.numel() * 4 for p in trainer._stat_params()),
    }


# --- per GPU: the one-process measurement composed with N processes and a sharding ---------------------------------
SHARDINGS = ("replicate", "full_shard", "shard_grad_op")
PHASES = ("rollout", "replay", "optimizer")
PARTS = ("trained", "frozen", "grads", "optimizer", "reference", "record", "activations", "gathered", "rewards")


def per_gpu(step: Step, n: int, sharding: str, rewards: int) -> dict:
    """The predicted per-GPU peak of `step` run by n processes under `sharding` (module docstring), by part (bytes)."""
    s = step.sizes
    fsdp = n > 1 and sharding != "replicate"
    share = 1 / n if fsdp else 1.0
    chunked = step.run.replay_chunk is not None and step.run.replay_chunk < s["mask_steps"]
    bf16 = lambda b: b // 2  # noqa: E731  gathered parameters (FSDP's mixed precision)
    phases = {}
    for phase in PHASES:
        if phase not in step.peaks:
            continue
        got = Counter(step.peaks[phase][1])
        # FSDP accumulates the unsynchronised chunks' gradients unsharded, in fp32, until the last chunk reduces
        grads = 1.0 if phase == "replay" and chunked else share
        parts = {
            "trained": got["trained"] * share,
            "frozen": got["frozen"] * share + got["encoders"] + got["buffers"],
            "grads": got["grad"] * grads,
            "optimizer": got["optim"] * share,
            "reference": got["reference"] * share,
            "record": got["record"],
            "activations": got["act"] + (0 if fsdp else got["cast"]),
        }
        gathered = 0
        if n > 1 and sharding == "replicate":
            gathered = s["fsdp_trained"]  # DDP's gradient buckets
        elif fsdp and phase != "optimizer":
            held = bf16(s["fsdp"]) if sharding == "shard_grad_op" else bf16(s["root"]) + 2 * bf16(s["unit"])
            ref = bf16(s["root"]) + 2 * bf16(s["unit"]) if s["reference"] and phase == "replay" else 0
            grads = max(s["unit_trained"], s["root_trained"]) * 6 // 4 if phase == "replay" else 0  # bf16 + fp32
            # the gradient statistic: each group's local (unreduced) gradient summed in fp32 during the backward
            stat = s.get("stat", s["fsdp_trained"]) if phase == "replay" else 0
            gathered = held + ref + grads + stat
        parts["gathered"] = gathered
        parts["rewards"] = rewards
        parts = {k: int(parts[k]) for k in PARTS}
        tensors = sum(parts.values())
        parts["allowance"] = int(ALLOWANCE_FIXED + ALLOWANCE_SHARE * tensors)
        phases[phase] = parts | {"total": tensors + parts["allowance"]}
    worst = max(phases, key=lambda p: phases[p]["total"])
    out = dict(
        phases[worst],
        phase=worst,
        act_rollout=phases["rollout"]["activations"] + phases["rollout"]["record"],
        act_replay=phases["replay"]["activations"] + phases["replay"]["record"],
    )
    return out


# --- the reward models' weights ----------------------------------------------------------------------------------
def _reward_model(name: str):
    """The scorer's network built from its published architecture (transformers' classes; nothing is read or
    downloaded). hpsv2: open_clip ViT-H-14 in CLIPModel's layout (986.11 M parameters, as open_clip's own profile
    lists for ViT-H-14); git_vqa: microsoft/git-large-vqav2 (transformers' GIT conversion: CLIP ViT-L/14 at 420 px
    plus GitConfig's 6-layer decoder); grounding_dino: IDEA-Research/grounding-dino-base (Swin-B at 384, window 12,
    BERT-base text encoder, 6 + 6 layers, 900 queries)."""
    from transformers import (
        CLIPConfig,
        CLIPModel,
        GitConfig,
        GitForCausalLM,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        SwinConfig,
    )

    if name == "hpsv2":
        return CLIPModel(
            CLIPConfig(
                text_config=dict(
                    hidden_size=1024,
                    intermediate_size=4096,
                    num_attention_heads=16,
                    num_hidden_layers=24,
                    vocab_size=49408,
                    max_position_embeddings=77,
                ),
                vision_config=dict(
                    hidden_size=1280,
                    intermediate_size=5120,
                    num_attention_heads=16,
                    num_hidden_layers=32,
                    patch_size=14,
                    image_size=224,
                ),
                projection_dim=1024,
            )
        )
    if name == "git_vqa":
        return GitForCausalLM(
            GitConfig(
                vision_config=dict(
                    image_size=420,
                    patch_size=14,
                    hidden_size=1024,
                    intermediate_size=4096,
                    num_hidden_layers=24,
                    num_attention_heads=16,
                )
            )
        )
    if name == "grounding_dino":
        swin = SwinConfig(
            embed_dim=128,
            depths=[2, 2, 18, 2],
            num_heads=[4, 8, 16, 32],
            window_size=12,
            image_size=384,
            out_indices=[2, 3, 4],
        )
        return GroundingDinoForObjectDetection(GroundingDinoConfig(backbone_config=swin))
    raise ValueError(f"reward model {name!r}: no architecture known to the plan (hpsv2, git_vqa, grounding_dino)")


def reward_weights(config: dict, reward: str) -> dict[str, dict]:
    """Parameters and bytes on each GPU of the scorers `rewards.<reward>` uses (dtype: reward_models.<name>.dtype)."""
    out = {}
    for name in config["rewards"][reward]:
        dtype = getattr(torch, config["reward_models"][name].get("dtype", "float32"))
        with torch.device("meta"):
            model = _reward_model(name)
        params = sum(p.numel() for p in model.parameters())
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        out[name] = {
            "params": params,
            "dtype": str(dtype).removeprefix("torch."),
            "bytes": params * torch.empty((), dtype=dtype).element_size() + buffers,
        }
    return out


# --- the plan: every variant at the official per-GPU batch, and the setting that ran out of memory -----------------
VARIANTS = ("grpo", "fix", "mte", "sim", "head")
# prompts per GPU, micro-batches, chosen AR steps per backward
SETTINGS = {
    "new": dict(micro_batches=1, replay_chunk=1),
    "old": dict(prompts=3, micro_batches=2, replay_chunk=None),
}  # the H200 run of docs/real-scale.md


VERBOSE = False  # each phase's end, as it happens (the full-size steps take minutes)


def plan_step(run: Run, steps: int | None, say=print) -> Step:
    """Record the tape on the narrow twin, then take the fake full-size step."""
    if VERBOSE:
        print(f"  {run.policy} {run.variant} [{run.label()}]: recording on the narrow twin ...", flush=True)
    rec = isolated(measure, run, False, True, None, steps)
    if VERBOSE:
        print(f"    recorded {len(rec.tape)} values ({rec.seconds:.0f} s); the fake step ...", flush=True)
    step = isolated(measure, run, True, False, rec.tape, steps)
    step.seconds, step.cpu_seconds = step.seconds + rec.seconds, step.cpu_seconds + rec.cpu_seconds
    K, R = step.ar_steps
    say(
        f"  {run.policy} {run.variant} [{run.label()}]: {len(rec.tape)} recorded values, "
        f"rollout of {R} of {K} AR steps; "
        + ", ".join(f"{p} {step.peaks[p][0] / GiB:.1f} GiB" for p in PHASES)
        + f" of tensors ({step.seconds:.0f} s)"
    )
    return step


def _child(fn, args: tuple, queue) -> None:
    import faulthandler
    import os

    faulthandler.enable()
    out = fn(*args)
    if isinstance(out, Step) and out.fake:
        out.tape = []  # a fake step's tape is the one it was given
    queue.put(out)
    queue.close()
    queue.join_thread()
    sys.stdout.flush()
    os._exit(0)  # no exit handlers: the answer is out


def preload() -> None:
    """What every step imports, imported once before the children are forked."""
    import importlib

    for name in (
        "accelerate",
        "margrpo.experiment.config",
        "margrpo.grpo.trainer",
        "margrpo.policy.nova",
        "margrpo.policy.harmon",
        "diffusers.models.autoencoders.autoencoder_kl",
        "transformers.models.phi.modeling_phi",
        "transformers.models.qwen2.modeling_qwen2",
    ):
        importlib.import_module(name)


def isolated(fn, *args, retries: int = 2, fresh: bool = False):
    """fn(*args) in a child process (forked: nothing to import again), so that each measured step starts from
    this process's clean state: after a step had run, building the next policy in the same process died of a
    segfault now and then (in transformers' PhiModel init, inside `re` / `packaging`; never in a plain trainer;
    the cause is open), and a real step's resident set then counts that step alone. A child that dies without
    an answer is run again (`retries` times), and said so. `fresh`: a new interpreter instead (spawned), whose
    resident set holds nothing of this one's."""
    import multiprocessing as mp
    import queue as queues

    ctx = mp.get_context("fork" if sys.platform == "linux" and not fresh else "spawn")
    for attempt in range(retries + 1):
        answers = ctx.Queue()
        child = ctx.Process(target=_child, args=(fn, args, answers))
        child.start()
        while True:
            try:
                out = answers.get(timeout=1)
                child.join()
                return out
            except queues.Empty:
                if not child.is_alive():
                    break
        print(
            f"  (the process for {fn.__name__} exited with code {child.exitcode} and no answer; "
            f"{'running it again' if attempt < retries else 'giving up'})",
            flush=True,
        )
    raise RuntimeError(f"{fn.__name__}: every process died")


def sharding_of(config: dict, name: str) -> str:
    """The config's policies.<name>.sharding (the trainer's default, replicate, when the key is absent)."""
    return config["policies"][name].get("sharding", "replicate")


COLUMNS = [
    ("trained", "trained"),
    ("frozen", "frozen+buf"),
    ("grads", "grads"),
    ("optimizer", "AdamW"),
    ("reference", "KL ref"),
    ("rewards", "rewards"),
    ("act_rollout", "rollout act"),
    ("act_replay", "replay act"),
    ("gathered", "FSDP/DDP"),
    ("allowance", "allowance"),
    ("total", "peak / GPU"),
]


def table(rows: list[dict], unit: int = GiB) -> str:
    """Markdown: one row per (variant, setting, GPUs), parts in GiB (MiB: `unit`), the verdicts against 80 and 139
    GiB."""
    name = "GiB" if unit == GiB else "MiB"
    head = (
        ["variant", "batch / GPU", "GPUs", "sharding"]
        + [f"{h} {name}" for _, h in COLUMNS]
        + ["phase", "80 GiB", "139 GiB"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["variant"], r["batch"], str(r["gpus"]), r["sharding"]] + [f"{r[k] / unit:.1f}" for k, _ in COLUMNS]
        cells += [r["phase"]] + [
            ("fits, " if r["total"] <= v else "OOM, ") + f"{(v - r['total']) / GiB:+.1f}" for v in LIMITS.values()
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plan(args, say=print) -> dict:
    """Every (policy, variant) at the new per-GPU batch and, with --old, the old setting on one GPU."""
    out = {"policies": {}}
    for path in args.config:
        config = Run("nova", "grpo", config_path=Path(path)).config()
        name = next(iter(config["policies"]))  # a paper config trains one policy
        base = Run(name, "grpo", size=args.size, config_path=Path(path), reward=args.reward)
        rewards = reward_weights(config, args.reward) if args.size == "full" else {}
        reward_bytes = sum(r["bytes"] for r in rewards.values())
        sharding = args.sharding or sharding_of(config, name)
        names = ", ".join(f"{k} {v['params'] / 1e6:.0f} M {v['dtype']}" for k, v in rewards.items()) or "none"
        say(
            f"{name}: reward models ({args.reward}) {names} = {reward_bytes / GiB:.2f} GiB; "
            f"sharding {sharding} with several GPUs"
        )
        rows, steps = [], args.steps.setdefault(name, {})
        settings = {
            "new": {**SETTINGS["new"], "prompts": args.prompts_per_gpu},
            **({"old": SETTINGS["old"]} if args.old else {}),
        }
        runs = {
            (v, s): replace(base, variant=v, **batch)
            for v in args.variants
            for s, batch in settings.items()
            if s == "new" or v in args.old_variants
        }
        if args.from_json:  # the fake steps of an earlier run, composed again
            saved = json.loads(Path(args.from_json).read_text())["policies"][name]["steps"]
            for key, run in runs.items():
                got = saved[f"{key[0]}/{key[1]}"]
                got["sizes"].setdefault("mask_steps", config["grpo"]["mask_steps"])  # runs before it was recorded
                steps[key] = Step(
                    run,
                    True,
                    {p: tuple(v) for p, v in got["peaks"].items()},
                    got["sizes"],
                    got["seconds"],
                    got["cpu_seconds"],
                    tuple(got["ar_steps"]),
                )
        else:
            steps.update((key, plan_step(run, args.rollout_steps, say)) for key, run in runs.items())
        for (variant, setting), run in runs.items():
            step, group = steps[(variant, setting)], config["grpo"]["group_size"]
            label = f"{run.prompts} x {group}, mb {run.micro_batches}, chunk {run.replay_chunk or 'all'}"
            for n in args.gpus if setting == "new" else [1]:
                rows.append(
                    {
                        "variant": variant,
                        "setting": setting,
                        "batch": label,
                        "gpus": n,
                        "sharding": sharding if n > 1 else "-",
                        **per_gpu(step, n, sharding, reward_bytes),
                        "modes": {m: per_gpu(step, n, m, reward_bytes)["total"] for m in SHARDINGS},
                    }
                )
        unit = GiB if args.size == "full" else 2**20
        out["policies"][name] = {
            "rewards": rewards,
            "sharding": sharding,
            "rows": rows,
            "table": table(rows, unit),
            "steps": {
                f"{v}/{s}": {
                    "peaks": st.peaks,
                    "sizes": st.sizes,
                    "ar_steps": st.ar_steps,
                    "seconds": st.seconds,
                    "cpu_seconds": st.cpu_seconds,
                }
                for (v, s), st in steps.items()
            },
        }
        say(f"\n### {name}\n\n{table(rows, unit)}\n")
    return out


# --- validation: the fake step against the same step on real tensors (small NOVA, CPU) -----------------------------
def validate(run: Run, steps: int | None, fake: Step | None = None, fresh: bool = True, say=print) -> dict:
    """One step of `run` for real, in a fresh process (its RSS counts this step alone), against the fake step's
    prediction (`fake`, or planned here): the peak of the live tensors (the same ledger on real tensors) and the
    resident set's growth (`fresh`: in a new interpreter, whose resident set holds nothing of this one's)."""
    real = isolated(measure, run, False, False, None, steps, fresh=fresh)
    fake = fake or plan_step(run, steps, say=lambda *_: None)
    out = {
        "run": run.label(),
        "policy": run.policy,
        "size": run.size,
        "real_peak": real.peak,
        "fake_peak": fake.peak,
        "real_step": real.peak - real.start,
        "fake_step": fake.peak - fake.start,
        "rss_step": real.rss[1] - real.rss[0],
        "allocated_step": real.allocated,
        "phases": {p: (real.peaks[p][0], fake.peaks[p][0]) for p in PHASES},
    }
    out["ratio_peak"] = out["fake_peak"] / out["real_peak"]
    out["ratio_step"] = out["fake_step"] / out["real_step"]
    out["ratio_rss"] = out["fake_step"] / out["rss_step"]
    out["ratio_allocated"] = out["fake_step"] / out["allocated_step"]
    mib = lambda b: f"{b / 2**20:.1f} MiB"  # noqa: E731
    say(
        f"validation, {run.policy} ({run.size}) [{run.label()}], fake vs real on this CPU:\n"
        f"  tensor peak: fake {mib(out['fake_peak'])}, real {mib(out['real_peak'])}: ratio {out['ratio_peak']:.4f}\n"
        f"  the step's growth over what it starts from: fake {mib(out['fake_step'])}, "
        f"real tensors {mib(out['real_step'])}"
        f" (ratio {out['ratio_step']:.4f}), real resident set {mib(out['rss_step'])} (ratio {out['ratio_rss']:.3f}),"
        f" torch's allocator record {mib(out['allocated_step'])} (ratio {out['ratio_allocated']:.4f})"
    )
    return out


# the one GPU measurement of a full-size step (docs/real-scale.md, "On a GPU", the second session: one H200, torch 2.11
# + cu130, real_scale.py --replay-chunk 1 --steps 1): torch.cuda.max_memory_allocated over a warm-up and a timed step
# of NOVA-0.6B at 3 prompts x 4 images on one GPU, micro_batches 1, replay_chunk 1, bf16, no reward model
GPU_SESSION = {("nova", "fix"): 82.9 * GiB, ("nova", "grpo"): 93.4 * GiB}


def gpu_check(args, say=print) -> list[dict]:
    """The plan's tensor peak (no reward model, no allowance: what max_memory_allocated counts) of the step the GPU
    session measured, with the trainer's own draw of chosen AR steps (its first step's) and with the worst case."""
    wanted = {tuple(item.split(":")) for item in args.gpu_check_runs.split(",")}
    rows, runs = (
        [],
        [
            Run(policy, variant, prompts=3, micro_batches=1, replay_chunk=1, chosen=chosen)
            for policy, variant in GPU_SESSION
            for chosen in ("drawn", "first")
            if (variant, chosen) in wanted
        ],
    )
    for run in runs:
        step = plan_step(run, args.rollout_steps, say=lambda *_: None)
        policy, variant, chosen, measured = run.policy, run.variant, run.chosen, GPU_SESSION[(run.policy, run.variant)]
        rows.append(
            {
                "policy": policy,
                "variant": variant,
                "chosen": chosen,
                "predicted": step.peak,
                "measured": measured,
                "ratio": step.peak / measured,
                "phase": max(step.peaks, key=lambda p: step.peaks[p][0]),
            }
        )
        say(
            f"  GPU check {policy} {variant} (3 x 4 images on one GPU, chunk 1, chosen AR steps {chosen}): "
            f"predicted tensor peak {step.peak / GiB:.1f} GiB, measured {measured / GiB:.1f} GiB: "
            f"ratio {rows[-1]['ratio']:.3f}"
        )
    return rows


# --- main ------------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--config",
        nargs="*",
        default=[str(ROOT / "config" / f"paper-{n}.yaml") for n in BUILD],
        help="paper configs, each training one policy (nova or harmon); none: only --validate / --gpu-check",
    )
    p.add_argument("--variants", default=None, help=f"default: {','.join(VARIANTS)} (--test: grpo)")
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 3, 8])
    p.add_argument("--reward", default="mixed", help="the rewards.<name> whose scorers sit on each GPU")
    p.add_argument("--prompts-per-gpu", type=int, default=1, help="prompt groups per GPU (official runs: 1)")
    p.add_argument(
        "--sharding", choices=SHARDINGS, default=None, help="default: the config's policies.<name>.sharding"
    )
    p.add_argument(
        "--old-variants",
        default=None,
        help="variants also planned at the old setting (default: all; --test: grpo; empty: none)",
    )
    p.add_argument("--rollout-steps", type=int, default=None, help="AR steps the rollout runs (default |M|; 0: all)")
    p.add_argument(
        "--validate",
        action="store_true",
        help="also the fake-vs-real check on a small NOVA (every AR step: --rollout-steps 0)",
    )
    p.add_argument("--gpu-check", action="store_true", help="also the step the GPU session measured (NOVA, 12 images)")
    p.add_argument(
        "--gpu-check-runs",
        default="fix:drawn,fix:first,grpo:drawn,grpo:first",
        help="which of the GPU session's steps --gpu-check plans: VARIANT:CHOSEN, comma-separated",
    )
    p.add_argument("--json", default=None, help="write every number here")
    p.add_argument(
        "--from-json", default=None, help="compose the fake steps of an earlier --json again (no step is run)"
    )
    p.add_argument("--test", action="store_true", help="tiny policies: everything in about a minute (tests)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    args.variants = (args.variants or ("grpo" if args.test else ",".join(VARIANTS))).split(",")
    old = args.old_variants if args.old_variants is not None else "grpo" if args.test else ",".join(VARIANTS)
    args.old_variants = [v for v in old.split(",") if v]
    args.old = bool(args.old_variants)
    args.size = "tiny" if args.test else "full"
    bad = sorted(set(args.variants + args.old_variants) - set(VARIANTS))
    if bad:
        p.error(f"unknown variants {bad}; expected some of {', '.join(VARIANTS)}")
    if args.rollout_steps == 0:
        args.rollout_steps = None
    elif args.rollout_steps is None:
        args.rollout_steps = 1  # raised to |M| by `instrumented`
    torch.set_num_threads(args.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    print(
        f"memory plan on {cpu_model()} ({args.threads} thread(s)), torch {torch.__version__}; "
        f"{'tiny policies (--test)' if args.test else 'full-size policies'}, fake tensors; allowance "
        f"{ALLOWANCE_FIXED / GiB:.0f} GiB + {ALLOWANCE_SHARE:.0%} of the tensor peak",
        flush=True,
    )
    out = {
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "threads": args.threads,
        "size": args.size,
        "allowance": {"fixed": ALLOWANCE_FIXED, "share": ALLOWANCE_SHARE},
        "limits": LIMITS,
        "gpus": args.gpus,
        "reward": args.reward,
        "prompts_per_gpu": args.prompts_per_gpu,
        "settings": SETTINGS,
    }
    global VERBOSE
    VERBOSE, args.steps = not args.test, {}
    preload()
    out.update(plan(args))
    if args.test and "nova" in args.steps and ("grpo", "new") in args.steps["nova"]:  # the planned step, for real
        step = args.steps["nova"][("grpo", "new")]
        out["validation"] = validate(step.run, None, fresh=False)  # every AR step: nothing added to the ledger by hand
    if args.validate:  # memory_levers.py's small NOVA: 2 prompts x 4 images, |M| = 4 replayed at once
        small = Run("nova", "grpo", size="small", prompts=2, micro_batches=1, replay_chunk=None)
        out["validation" if not args.test else "validation_small"] = validate(small, args.rollout_steps)
    if args.gpu_check and not args.test:
        out["gpu_check"] = gpu_check(args)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["wall_s"], out["cpu_s"] = (
        time.perf_counter() - t0,
        time.process_time() - c0 + children.ru_utime + children.ru_stime,
    )
    print(f"wall {out['wall_s']:.0f} s, CPU {out['cpu_s']:.0f} s (with its child processes)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return out


if __name__ == "__main__":
    main()
