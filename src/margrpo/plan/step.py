"""One steady-state GRPO step of one process, measured by the ledger: on fake tensors (the plan, replaying the tape)
or real ones (the narrow twin that records the tape, and the validation); the sizes the per-GPU composition
needs; the CPU allocator's own record of a real step (torch's profiler)."""

from __future__ import annotations

import contextlib
import gc
import resource
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from margrpo.plan.cuda_autocast import CudaAutocast
from margrpo.plan.instrument import PlanHooks, instrumented
from margrpo.plan.ledger import Ledger
from margrpo.plan.policies import BUILD
from margrpo.plan.stand_ins import PROMPTS, brightness
from margrpo.plan.tape import Tape, recording, stand_in_attention

ROOT = Path(__file__).resolve().parents[3]  # the checkout (the package is installed editable): config/ is at its root


def paper_config(policy: str) -> Path:
    """The checkout's config/paper-<policy>.yaml, a step's default config; an error naming it where it is not."""
    path = ROOT / "config" / f"paper-{policy}.yaml"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no such file; the plan reads config/paper-{policy}.yaml of the repository checkout that "
            "margrpo is installed from (editable) unless --config names the configs (--validate and --gpu-check "
            "always read it)"
        )
    return path


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

        return load_config(self.config_path or paper_config(self.policy))

    def label(self) -> str:
        chunk = "all" if self.replay_chunk is None else self.replay_chunk
        return f"{self.prompts} x G images, micro_batches {self.micro_batches}, replay_chunk {chunk}"


def make_trainer(run: Run, policy, out: str, precision: str | None = None, hooks=None):
    """The real trainer as the train stage builds it from the paper config, with this run's batch on one process."""
    from accelerate import Accelerator

    from margrpo.experiment.config import train_spec
    from margrpo.grpo.rollout import SamplingConfig
    from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
    from margrpo.policy.settings import PolicySettings
    from margrpo.prompts.suites import PromptSet

    spec = train_spec(run.config(), run.policy, run.reward, run.variant)
    sampling, grpo = SCHEDULES[run.size]
    # the policy's own settings (frozen parts, gradient checkpointing, LoRA) as the config sets them; one process:
    # nothing to shard
    spec["policy"] = {k: v for k, v in (spec.get("policy") or {}).items() if k != "sharding"}
    # the gradient-variance probe's snapshot is planned from its size (`group_sizes`), not measured: on one process
    # it would need two micro-batches, and under FSDP it is a shard of what one process measures
    spec["grpo"].update(
        grpo,
        batch_prompts=run.prompts,
        micro_batches=run.micro_batches,
        replay_chunk=run.replay_chunk,
        trackers=[],
        grad_variance=False,
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
        policy_settings=PolicySettings.from_spec(spec),
        hooks=hooks,
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
        if cheap:
            stand_in_attention(policy)
        with tempfile.TemporaryDirectory(prefix="memory_plan-") as out:
            trainer = make_trainer(run, policy, out, "no" if cheap else None, PlanHooks(ledger))
        warm(trainer)
        register(ledger, trainer)
        sizes = group_sizes(trainer, probe=run.config()["grpo"].get("grad_variance", False))
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

        def inside(m):
            return bool(list(m.parameters())) and all(id(p) in model for p in m.parameters())

        return [b for m in policy.modules() if isinstance(m, torch.nn.ModuleList) for b in m if inside(b)]
    return shard_units(policy, head)


def group_sizes(trainer, probe: bool = False) -> dict[str, int]:
    """Bytes (fp32) the composition needs: the FSDP-managed parameters (AR and head) and their trained part, the
    root group and the largest block group (all, trained), the reference's own copy, everything else, and (`probe`:
    grpo.grad_variance on) the gradient-variance probe's snapshot of the gradients it reads."""
    policy = trainer.policy
    head = {id(p) for p in policy.head_parameters()}
    model = head | {id(p) for p in policy.ar_parameters()}
    units, taken, own = _shard_units(policy, head), set(), []
    for unit in units:  # innermost first: a group owns what no group inside it took
        mine = [p for p in unit.parameters() if id(p) not in taken]
        taken |= {id(p) for p in mine}
        own.append(mine)

    def nbytes(ps):
        return sum(p.numel() * p.element_size() for p in ps)

    def trained(ps):
        return [p for p in ps if p.requires_grad]

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
        "stat": sum(p.numel() * 4 for p in trainer.stat_params) if probe else 0,
    }
