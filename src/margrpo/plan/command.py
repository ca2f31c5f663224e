"""Per-GPU memory plan of one GRPO step of NOVA-0.6B / Harmon-1.5B, computed on a CPU with fake tensors (no GPU).

How. The real trainer (`GRPOTrainer.train_step`: rollout_and_score, plan_updates, update with its backward passes in
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
  the root group's unsharded fp32 parameters while it runs plus two block groups (the one running and the one
  prefetched), the reference's as much in the replay, and one group's unsharded gradient (bf16, then fp32 for
  the reduce-scatter); autocast's bf16 weight copies as on one process (the one mixed-precision mechanism,
  issue 52: FSDP gathers fp32 parameters and casts nothing). In a chunked replay the
  chunks before the last run without gradient sync (`FSDPEngine.reduce_each_chunk` False), and FSDP2 keeps their
  gradients unsharded, accumulated in fp32, until the last chunk reduces them: during the replay the gradients are
  whole (benchmarks/chunk_reduction.py);
- shard_grad_op (FSDP2, reshard_after_forward=False, ZeRO-2): as full_shard, but the policy's FSDP parameters stay
  gathered in fp32 for the whole step; the reference reshards after each forward.
With `grpo.grad_variance` on, the gradient-variance probe (`grpo.grad_stats`) holds one snapshot of the gradients
it reads (the AR's trained parameters; the head's for head-only) between the replay's micro-batches: whole on one
process and under DDP, this process's shards under FSDP (its own column, only then).
FSDP groups are `margrpo.grpo.parallel.shard_units` (every block of an nn.ModuleList made of AR / head
parameters, then the children of each largest head-only module) and the root (the rest of the AR and the head).
Reward models' weights (per `reward_models.<name>.dtype`, float32 by default) are whole on every GPU; their
parameter counts come from their architectures built on the meta device (`reward_weights`).

Where each piece lives in margrpo.plan: the ledger (ledger.py), the tape (tape.py), CUDA's autocast policy
(cuda_autocast.py), the hooks around the trainer (instrument.py), one measured step (step.py), the policies and
their stand-in prompts, tokenizer and reward (policies.py, stand_ins.py), the step planned in child processes
(fake_step.py), the per-GPU composition and the allowance (composition.py), the scorers' weights
(reward_weights.py), the checks (validation.py), and this command.

    margrpo plan [--config config/paper-nova.yaml ...] [--variants grpo,fix,mte,sim,head] [--gpus 1 3 8]
        [--old-variants LIST] [--reward mixed] [--prompts-per-gpu 1] [--sharding MODE]
        [--rollout-steps N] [--validate] [--gpu-check] [--gpu-check-runs LIST] [--json OUT] [--from-json IN]
        [--test] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import replace
from pathlib import Path

from margrpo.plan import ledger
from margrpo.plan.composition import ALLOWANCE_FIXED, ALLOWANCE_SHARE, LIMITS, SHARDINGS, per_gpu, table
from margrpo.plan.fake_step import plan_step, preload
from margrpo.plan.ledger import GiB
from margrpo.plan.policies import BUILD
from margrpo.plan.reward_weights import reward_weights
from margrpo.plan.step import Run, Step, paper_config
from margrpo.plan.validation import gpu_check, validate

# --- the plan: every variant at the official per-GPU batch, and the setting that ran out of memory -----------------
VARIANTS = ("grpo", "fix", "mte", "sim", "head")
# prompts per GPU, micro-batches, chosen AR steps per backward
SETTINGS = {
    "new": dict(micro_batches=1, replay_chunk=1),
    "old": dict(prompts=3, micro_batches=2, replay_chunk=None),
}  # the H200 run of docs/real-scale.md


def sharding_of(config: dict, name: str) -> str:
    """The config's policies.<name>.sharding (the trainer's default, replicate, when the key is absent)."""
    return config["policies"][name].get("sharding", "replicate")


def _runs(args, base: Run) -> dict[tuple[str, str], Run]:
    """(variant, setting) -> its run: every variant at the new per-GPU batch, --old-variants at the old one."""
    settings = {
        "new": {**SETTINGS["new"], "prompts": args.prompts_per_gpu},
        **({"old": SETTINGS["old"]} if args.old else {}),
    }
    return {
        (v, s): replace(base, variant=v, **batch)
        for v in args.variants
        for s, batch in settings.items()
        if s == "new" or v in args.old_variants
    }


def _saved_steps(path: str, name: str, config: dict, runs: dict) -> dict:
    """The fake steps of an earlier --json run, for these runs."""
    saved = json.loads(Path(path).read_text())["policies"][name]["steps"]
    steps = {}
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
    return steps


def _rows(args, runs: dict, steps: dict, group: int, sharding: str, reward_bytes: int) -> list[dict]:
    """One row per (variant, setting, GPUs): the new setting on each of --gpus, the old one on one GPU."""
    rows = []
    for (variant, setting), run in runs.items():
        step = steps[(variant, setting)]
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
    return rows


def _step_record(steps: dict) -> dict:
    return {
        f"{v}/{s}": {
            "peaks": st.peaks,
            "sizes": st.sizes,
            "ar_steps": st.ar_steps,
            "seconds": st.seconds,
            "cpu_seconds": st.cpu_seconds,
        }
        for (v, s), st in steps.items()
    }


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
        steps, runs = args.steps.setdefault(name, {}), _runs(args, base)
        if args.from_json:  # the fake steps of an earlier run, composed again
            steps.update(_saved_steps(args.from_json, name, config, runs))
        else:
            steps.update((key, plan_step(run, args.rollout_steps, say)) for key, run in runs.items())
        rows = _rows(args, runs, steps, config["grpo"]["group_size"], sharding, reward_bytes)
        unit = GiB if args.size == "full" else 2**20
        out["policies"][name] = {
            "rewards": rewards,
            "sharding": sharding,
            "rows": rows,
            "table": table(rows, unit),
            "steps": _step_record(steps),
        }
        say(f"\n### {name}\n\n{table(rows, unit)}\n")
    return out


# --- the command -----------------------------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description, p.formatter_class = __doc__, argparse.RawDescriptionHelpFormatter
    p.add_argument(
        "--config",
        nargs="*",
        default=None,
        help="paper configs, each training one policy (nova or harmon); none: only --validate / --gpu-check "
        f"(default: config/paper-{{{','.join(BUILD)}}}.yaml of the repository checkout)",
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


def _settle(args) -> None:
    """The defaults that depend on --test, the checks of the variants, and the checkout's paper configs where a
    default names them (an error naming the file where one is missing)."""
    from margrpo.infra.files import InputError

    args.variants = (args.variants or ("grpo" if args.test else ",".join(VARIANTS))).split(",")
    old = args.old_variants if args.old_variants is not None else "grpo" if args.test else ",".join(VARIANTS)
    args.old_variants = [v for v in old.split(",") if v]
    args.old = bool(args.old_variants)
    args.size = "tiny" if args.test else "full"
    bad = sorted(set(args.variants + args.old_variants) - set(VARIANTS))
    if bad:
        raise InputError(f"unknown variants {bad}; expected some of {', '.join(VARIANTS)}")
    if args.rollout_steps == 0:
        args.rollout_steps = None
    elif args.rollout_steps is None:
        args.rollout_steps = 1  # raised to |M| by `instrumented`
    if args.config is None:
        args.config = [str(paper_config(n)) for n in BUILD]
    if args.validate or args.gpu_check:  # their runs read the checkout's config/paper-nova.yaml
        paper_config("nova")


def _header(args) -> dict:
    """Say what runs where; the run's record (--json) as far as it is known before the steps."""
    import torch

    from margrpo.infra.kernels import cpu_model

    print(
        f"memory plan on {cpu_model()} ({args.threads} thread(s)), torch {torch.__version__}; "
        f"{'tiny policies (--test)' if args.test else 'full-size policies'}, fake tensors; allowance "
        f"{ALLOWANCE_FIXED / GiB:.0f} GiB + {ALLOWANCE_SHARE:.0%} of the tensor peak",
        flush=True,
    )
    return {
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


def run(args) -> dict:
    """The plan of --config's policies, the checks asked for, every number in --json; returns that record."""
    import torch

    _settle(args)
    torch.set_num_threads(args.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    out = _header(args)
    ledger.say_phases(not args.test)
    args.steps = {}
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
