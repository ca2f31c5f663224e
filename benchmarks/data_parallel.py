"""Data-parallel scaling of a GRPO step on the default toy, measured in one run on this machine.

The same global batch (the config's grpo.batch_prompts x group_size) and the same micro-batch split
are stepped by 1 process and by 2 processes (torchrun, gloo, one thread each); scaling efficiency =
t1 / (2 t2), 1.0 being perfect. Each process rolls out and replays half of the prompt groups; what
does not split is the gradient all-reduce, the gathers of rewards and statistics, and the optimizer
step, which every process repeats. The reward is a cheap stand-in (mean brightness): this measures
the trainer, not a scorer. Wall-clock medians of --steps steps after one warm-up step.

    python benchmarks/data_parallel.py [--config config/config.yaml] [--steps 4] [--policy FOLDER]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import PROMPTS, make_policy, reward  # noqa: E402

from margrpo.experiment.config import load_config  # noqa: E402
from margrpo.grpo.rollout import SamplingConfig  # noqa: E402
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer  # noqa: E402
from margrpo.prompts.suites import PromptSet  # noqa: E402


def worker(args) -> None:
    """One process of a torchrun job: time its steps; rank 0 prints the medians as JSON."""
    torch.set_num_threads(1)
    config = load_config(args.config)
    policy_name = config["experiments"]["ladder"]["policies"][0]
    sampling = SamplingConfig(**config["policies"][policy_name]["sampling"])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    grpo = {
        **config["grpo"],
        "freeze_head": True,
        "precision": config["mixed_precision"],
        "steps": args.steps + 1,
        "val_every": 10_000,
        "save_every": 10_000,
        "trackers": [],
        "micro_batches": max(1, config["grpo"]["micro_batches"] // world),
    }  # the same global split
    ps = PromptSet(PROMPTS * 4, [{}] * 4 * len(PROMPTS))  # enough prompts for any batch_prompts <= 16
    trainer = GRPOTrainer(make_policy(args.policy), reward, ps, ps, sampling, GRPOConfig(**grpo), tempfile.mkdtemp())
    times = []
    for _ in range(args.steps + 1):
        t0 = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - t0)
    if trainer.engine.is_main:
        print(
            "RESULT "
            + json.dumps(
                {
                    "world": world,
                    "median_s": statistics.median(times[1:]),
                    "times": times[1:],
                    "images": grpo["batch_prompts"] * grpo["group_size"],
                    "micro_batches": grpo["micro_batches"],
                }
            )
        )


def launch(nproc: int, args) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        __file__,
        "--worker",
        "--config",
        args.config,
        "--steps",
        str(args.steps),
    ] + (["--policy", args.policy] if args.policy else [])
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument(
        "--policy", default=None, help="a trained policy folder (default: random init of the config's toy size)"
    )
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    one, two = launch(1, args), launch(2, args)
    print(f"{one['images']} images per step, fix variant, one thread per process, {os.cpu_count()} cores")
    for r in (one, two):
        print(
            f"  {r['world']} process(es): median step {r['median_s']:.3f} s "
            f"(steps: {', '.join(f'{t:.2f}' for t in r['times'])})"
        )
    print(
        f"speed-up {one['median_s'] / two['median_s']:.2f}x, "
        f"scaling efficiency t1 / (2 t2) = {one['median_s'] / (2 * two['median_s']):.2f}"
    )


if __name__ == "__main__":
    main()
