"""Where a GRPO step's CPU time goes, on the default toy, measured on the real trainer (issue #37, item 3).

Each part is timed exclusively (a part called inside another counts only for itself) in this one-thread process's
CPU time, over --steps steps after a warm-up step:
- rollout: the AR transformer (`ar_forward`), the head (`head`), the text encoder, the decoder (tokens -> pixels),
  and the rest of `generate` (samplers, masks, the record);
- reward: the reward function (a cheap stand-in here, mean brightness: the trainer, not a scorer);
- replay: the AR transformer and the head recomputed with gradients, the reference's pass (KL), and the rest of
  the backward passes (autograd's backward, the log-densities, the loss);
- optimizer: the gradients' norms and clipping (with the update's statistics), and AdamW;
- other: the step's remaining Python (advantages, MTE / Sim masks, logging rows).
The parts are timed by subclasses of the trainer and the toy, built as such (`TimedTrainer`, `TimedPolicy`), by the
reward function the trainer is given and by the optimizer's step hooks: nothing in the step is replaced.

    python benchmarks/step_profile.py [--config config/config.yaml] [--variant fix] [--grpo '{"batch_prompts": 12}']
        [--token-channels 16]  (the toy's tokens as 16-channel latents a frozen linear codec decodes: issue 43)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import LatentToyMAR, make_policy, make_trainer, reward  # noqa: E402

from margrpo.experiment.config import load_config  # noqa: E402
from margrpo.grpo.rollout import SamplingConfig  # noqa: E402
from margrpo.grpo.trainer import GRPOTrainer  # noqa: E402
from margrpo.policy import ToyMAR  # noqa: E402

COLORS, SHAPES = ["red", "blue", "green", "yellow"], ["circle", "square", "triangle"]
PROMPTS = [f"a {c} {s}" for c in COLORS for s in SHAPES]  # 12: enough groups for 48 images a step
VARIANTS = {
    "grpo": {},
    "fix": {"freeze_head": True},
    "mte": {"freeze_head": True, "trajectories": 4, "top_frac": 0.3},
    "sim": {"freeze_head": True, "trajectories": 4, "top_frac": 0.3, "sim": True},
}


class Parts:
    """Exclusive CPU time per (phase, part): a part's time excludes the parts called inside it."""

    def __init__(self):
        self.seconds: dict[tuple[str, str], float] = defaultdict(float)
        self.stack: list[list] = []  # [phase outside, phase, part, start, time of the parts inside]
        self.phase = "other"
        self.policy = None  # the trainer's policy (its reference copy's parts are named apart)

    def start(self, part: str, phase: str | None = None) -> None:
        self.stack.append([self.phase, phase or self.phase, part, time.process_time(), 0.0])
        self.phase = phase or self.phase

    def stop(self) -> None:
        self.phase, phase, part, start, inner = self.stack.pop()
        spent = time.process_time() - start
        self.seconds[(phase, part)] += spent - inner
        if self.stack:
            self.stack[-1][4] += spent

    @contextlib.contextmanager
    def timed(self, part: str, phase: str | None = None):
        self.start(part, phase)
        try:
            yield
        finally:
            self.stop()


PARTS = Parts()


def _timed_method(name: str, part: str):
    def method(self, *args, **kwargs):
        with PARTS.timed(part if self is PARTS.policy else f"reference {name}"):
            return getattr(super(TimedPolicy, self), name)(*args, **kwargs)

    return method


class TimedPolicy:
    """Put before ToyMAR (or a subclass of it) in a class's bases: the policy's parts, timed."""

    ar_forward = _timed_method("ar_forward", "AR transformer")
    head = _timed_method("head", "head")
    encode_prompts = _timed_method("encode_prompts", "text encoder")
    decode = _timed_method("decode", "decoder")


class TimedToyMAR(TimedPolicy, ToyMAR):
    pass


class TimedLatentToyMAR(TimedPolicy, LatentToyMAR):
    pass


class TimedTrainer(GRPOTrainer):
    """The trainer's phases, timed: the rollout, the replay's backward passes (`accumulate`) and the rest of an update
    (the gradients' norms, clipping and the update's statistics); AdamW through the optimizer's step hooks."""

    def rollout_and_score(self, step: int | None = None):
        with PARTS.timed("generate (samplers, masks, record)", "rollout"):
            return super().rollout_and_score(step)

    def accumulate(self, batch, update):
        with PARTS.timed("backward, log-densities, loss", "replay"):
            return super().accumulate(batch, update)

    def update(self, batch, update):
        with PARTS.timed("gradient norms, clipping", "optimizer"):
            return super().update(batch, update)


def timed_reward(images, prompts, metadata):
    with PARTS.timed("reward function", "reward"):
        return reward(images, prompts, metadata)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--variant", default="fix", choices=sorted(VARIANTS))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--grpo", default="{}", help="grpo config overrides as JSON, e.g. '{\"batch_prompts\": 12}'")
    p.add_argument("--token-channels", type=int, default=None, help="tokens of this many channels (a linear codec)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    config = load_config(args.config)
    name = config["experiments"]["ladder"]["policies"][0]
    sampling = SamplingConfig(**config["policies"][name]["sampling"])
    grpo = {**config["grpo"], "precision": config["mixed_precision"], **json.loads(args.grpo), "trackers": []}
    channels = {"channels": args.token_channels} if args.token_channels else {}
    PARTS.policy = make_policy(None, TimedLatentToyMAR if channels else TimedToyMAR, **channels)
    variant = VARIANTS[args.variant]
    trainer = make_trainer(PARTS.policy, sampling, grpo, variant, args.steps, PROMPTS, timed_reward, TimedTrainer)
    trainer.optimizer.register_step_pre_hook(lambda *_: PARTS.start("AdamW", "optimizer"))
    trainer.optimizer.register_step_post_hook(lambda *_: PARTS.stop())
    cfg = trainer.cfg
    trainer.train_step()  # warm-up
    PARTS.seconds.clear()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(args.steps):
        trainer.train_step()
    cpu, wall = (time.process_time() - c0) / args.steps, (time.perf_counter() - w0) / args.steps
    per_step = {k: v / args.steps for k, v in PARTS.seconds.items()}
    per_step[("other", "the step's remaining Python")] = cpu - sum(per_step.values())
    images = cfg.batch_prompts * cfg.group_size
    print(
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread; {args.config}: {name}, "
        f"variant {args.variant}, {cfg.batch_prompts} x {cfg.group_size} = {images} images, K = {sampling.ar_steps}, "
        f"|M| = {cfg.mask_steps}, |T| = {cfg.diffusion_steps}, micro_batches {cfg.micro_batches}, {cfg.precision}"
    )
    print(f"a step: {cpu:.3f} CPU-s ({wall:.3f} s wall), mean of {args.steps} after a warm-up\n")
    print("| phase | part | CPU-s a step | share |\n|---|---|---|---|")
    for phase in ("rollout", "reward", "replay", "optimizer", "other"):
        rows = sorted(((k[1], v) for k, v in per_step.items() if k[0] == phase), key=lambda kv: -kv[1])
        for part, v in rows:
            print(f"| {phase} | {part} | {v:.3f} | {v / cpu:.1%} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "cpu_s": cpu,
                    "wall_s": wall,
                    "images": images,
                    "parts": {f"{k[0]}/{k[1]}": v for k, v in per_step.items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
