"""The plan's checks: the fake step against the same step on real tensors on this CPU (the ledger on real tensors,
the resident set, torch's allocator record), and against the one full-size step a GPU session measured."""

from __future__ import annotations

from margrpo.plan.composition import PHASES
from margrpo.plan.fake_step import isolated, plan_step
from margrpo.plan.ledger import GiB
from margrpo.plan.step import Run, Step, measure


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

    def mib(b):
        return f"{b / 2**20:.1f} MiB"

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
