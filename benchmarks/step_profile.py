"""Where a GRPO step's CPU time goes, on the default toy, measured on the real trainer (issue #37, item 3).

Each part is timed exclusively (a part called inside another counts only for itself) in this one-thread process's
CPU time, over --steps steps after a warm-up step:
- rollout: the AR transformer (`ar_forward`), the head (`head`), the text encoder, the decoder (tokens -> pixels),
  and the rest of `generate` (samplers, masks, the record);
- reward: the reward function (a cheap stand-in here, mean brightness: the trainer, not a scorer);
- replay: the AR transformer and the head recomputed with gradients, the reference's pass (KL), and the rest of
  the backward (autograd's backward, the log-densities, the loss);
- optimizer: gradient clipping and AdamW;
- other: the step's remaining Python (advantages, MTE / Sim masks, logging rows).

    python benchmarks/step_profile.py [--config config/config.yaml] [--variant fix] [--grpo '{"batch_prompts": 12}']
        [--token-channels 16]  (the toy's tokens as 16-channel latents a frozen linear codec decodes: issue 43)
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import grpo_step  # noqa: E402
from grpo_step import make_trainer  # noqa: E402

from margrpo.experiment.config import load_config  # noqa: E402
from margrpo.grpo.rollout import SamplingConfig  # noqa: E402
from margrpo.grpo.trainer import GRPOTrainer  # noqa: E402

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
        self.stack: list[list] = []  # [phase, part, start, time of the parts inside]
        self.phase = "other"

    def wrap(self, owner, name: str, part: str, phase: str | None = None) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            outer = self.phase
            if phase:
                self.phase = phase
            self.stack.append([self.phase, part, time.process_time(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                ph, pt, start, inner = self.stack.pop()
                spent = time.process_time() - start
                self.seconds[(ph, pt)] += spent - inner
                if self.stack:
                    self.stack[-1][3] += spent
                self.phase = outer

        setattr(owner, name, timed)


def instrument(trainer: GRPOTrainer, parts: Parts) -> None:
    policy, ref = trainer.policy, trainer.ref
    parts.wrap(trainer, "rollout_and_score", "generate (samplers, masks, record)", "rollout")
    parts.wrap(trainer, "reward_fn", "reward function", "reward")
    parts.wrap(trainer, "update", "backward, log-densities, loss", "replay")  # clip and AdamW: their own parts
    parts.wrap(trainer.optimizer, "step", "AdamW", "optimizer")
    parts.wrap(torch.nn.utils, "clip_grad_norm_", "clipping", "optimizer")
    for name, part in (
        ("ar_forward", "AR transformer"),
        ("head", "head"),
        ("encode_prompts", "text encoder"),
        ("decode", "decoder"),
    ):
        parts.wrap(policy, name, part)
    if ref is not None and ref is not policy:
        for name in ("ar_forward", "head", "encode_prompts"):
            parts.wrap(ref, name, f"reference {name}")


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
    grpo_step.TOKEN_CHANNELS[0] = args.token_channels
    config = load_config(args.config)
    name = config["experiments"]["ladder"]["policies"][0]
    sampling = SamplingConfig(**config["policies"][name]["sampling"])
    grpo = {**config["grpo"], "precision": config["mixed_precision"], **json.loads(args.grpo), "trackers": []}
    trainer = make_trainer(None, sampling, grpo, VARIANTS[args.variant], args.steps, prompts=PROMPTS)
    cfg = trainer.cfg
    trainer.train_step()  # warm-up
    parts = Parts()
    instrument(trainer, parts)
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(args.steps):
        trainer.train_step()
    cpu, wall = (time.process_time() - c0) / args.steps, (time.perf_counter() - w0) / args.steps
    per_step = {k: v / args.steps for k, v in parts.seconds.items()}
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
