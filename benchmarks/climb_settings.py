"""The settings that make RL climb on the toy, each chosen by a sweep: a rung's lift over its shuffled-advantage
control (`grpo.advantages: shuffled`: the same rollouts, noise and update sizes, no credit), one setting varied at a
time around a climbing run's own spec.json.

Why: a setting is worth what it buys in learning, and learning shows only against the control. A run alone climbs
or falls with its prompts and its random walk; the control, same seed, same base, same validation noise, takes both
away, so the lift is paired (docs/findings.md, "RL is seen to climb").

Each point trains the rung and its control through the trainer's own run loop (`GRPOTrainer.train`) for the spec's
steps on every seed of `--seeds` and prints the lift at the last step, mean +- s.e. over seeds, its range, and the
CPU-seconds of one run. The sweeps (`--sweeps`; each value replaces the spec's):

    lr        grpo.lr                                       the learning rate
    images    grpo.batch_prompts at the spec's group size   images a step
    group     grpo.group_size at the spec's images a step   group size (the baseline's sample)
    credit    (grpo.mask_steps, grpo.diffusion_steps)       the AR and diffusion steps credited
    kl        grpo.beta                                     the KL weight
    clip      grpo.clip_eps (null: no clipping)             the PPO clip range

    python benchmarks/climb_settings.py results/toy/train/toy-micro/redness/fix/seed0/spec.json \\
        [--seeds 0 1 2] [--sweeps lr images group credit kl clip] [--rung fix] [--csv out.csv]
    python benchmarks/climb_settings.py --test    # a tiny random policy, 2 steps: the code path works
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from margrpo.grpo.config import GRPOConfig
from margrpo.grpo.trainer import GRPOTrainer
from margrpo.policy import load_policy
from margrpo.policy.settings import PolicySettings
from margrpo.rewards import build_reward_mix
from margrpo.stages._common import prompt_set, sampling_config

RUNGS = {  # the ladder's rungs, as experiments' variants switch them
    "grpo": {"freeze_head": False},
    "fix": {"freeze_head": True},
    "mte": {"freeze_head": True, "trajectories": 4, "top_frac": 0.3},
    "sim": {"freeze_head": True, "trajectories": 4, "top_frac": 0.3, "sim": True, "tau": 0.0},
}


def sweep_points(name: str, grpo: dict) -> list[tuple[str, dict]]:
    """(label, grpo changes) of one sweep around the spec's `grpo`; the spec's own value is among them."""
    images = grpo["batch_prompts"] * grpo["group_size"]
    if name == "lr":
        return [(f"lr {v:g}", {"lr": v}) for v in (3e-4, 1e-3, 3e-3)]
    if name == "images":
        return [(f"{b * grpo['group_size']} images", {"batch_prompts": b}) for b in (2, 4, 8)]
    if name == "group":
        return [(f"G {g}", {"group_size": g, "batch_prompts": images // g}) for g in (4, 8, 16) if images % g == 0]
    if name == "credit":
        pairs = [(1, 2), (2, 3), (grpo["mask_steps"], grpo["diffusion_steps"])]
        return [(f"{m} AR x {d} diffusion", {"mask_steps": m, "diffusion_steps": d}) for m, d in dict.fromkeys(pairs)]
    if name == "kl":
        return [(f"beta {v:g}", {"beta": v}) for v in (0.0, 0.01, 0.1)]
    if name == "clip":
        return [(f"clip {v}", {"clip_eps": v}) for v in (0.05, 0.2, None)]
    raise SystemExit(f"--sweeps: unknown sweep {name!r}; expected lr, images, group, credit, kl, clip")


class Runner:
    """Trains one (rung, advantages, changes, seed) from the spec's base policy and returns its validation rewards."""

    def __init__(self, spec: dict, root: Path, policy_dir: Path | None = None, reward=None):
        self.spec, self.root = spec, root
        inputs = {k: root / v for k, v in spec.get("inputs", {}).items() if v}
        self.policy_dir = policy_dir or inputs["policy_dir"]
        suites = inputs.get("suites_dir")
        self.train = prompt_set(suites / "train.jsonl") if suites else None
        self.val = prompt_set(suites / "val.jsonl") if suites else None
        self.reward = reward or build_reward_mix(spec["reward"]["weights"], {})

    def run(self, rung: str, advantages: str, changes: dict, seed: int) -> tuple[list[float], float]:
        spec = copy.deepcopy(self.spec)
        spec["grpo"].update(changes, advantages=advantages, trackers=[])
        spec["variant"] = {"name": rung, **RUNGS[rung]}
        cfg = GRPOConfig.from_spec(spec, precision="no")
        cfg.seed = seed
        cfg.val_every = cfg.save_every = cfg.steps  # the base and the last step: the lift is read at the end
        policy = load_policy(self.policy_dir, torch.device("cpu"))
        start = time.process_time()
        with tempfile.TemporaryDirectory(prefix="climb-settings-") as out:
            trainer = GRPOTrainer(
                policy,
                self.reward,
                self.train,
                self.val,
                sampling_config(spec["sampling"]),
                cfg,
                out,
                policy_settings=PolicySettings.from_spec(spec),
            )
            trainer.train()
            scores = trainer.checkpoints[-1]["val_scores"]
        return list(scores), time.process_time() - start


def lift(runner: Runner, rung: str, changes: dict, seeds: list[int]) -> dict:
    """The rung's last-step validation reward minus its control's, per seed (paired by prompt), and their summary."""
    per_seed, cpu = [], []
    for seed in seeds:
        trained, t1 = runner.run(rung, "group", changes, seed)
        control, t2 = runner.run(rung, "shuffled", changes, seed)
        per_seed.append(statistics.fmean(a - b for a, b in zip(trained, control)))
        cpu += [t1, t2]
    se = statistics.stdev(per_seed) / math.sqrt(len(per_seed)) if len(per_seed) > 1 else math.nan
    return {
        "lift": statistics.fmean(per_seed),
        "se": se,
        "min": min(per_seed),
        "max": max(per_seed),
        "per_seed": per_seed,
        "cpu_s": statistics.fmean(cpu),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("spec", nargs="?", type=Path, help="a climbing run's spec.json (results/<name>/train/...)")
    p.add_argument("--root", type=Path, default=Path("."), help="the folder the spec's inputs are relative to")
    p.add_argument("--policy-dir", type=Path, default=None, help="the base policy (default: the spec's input)")
    p.add_argument("--rung", choices=sorted(RUNGS), default="fix")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sweeps", nargs="+", default=["lr", "images", "group", "credit", "kl", "clip"])
    p.add_argument("--csv", type=Path, default=None)
    p.add_argument("--test", action="store_true", help="a tiny random policy and the redness reward, 2 steps")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    if args.test:
        runner, args.seeds, args.sweeps = _tiny_runner(), [0, 1], ["lr", "clip"]
    elif args.spec is None:
        p.error("give a climbing run's spec.json, or --test")
    else:
        runner = Runner(json.loads(args.spec.read_text()), args.root, args.policy_dir)
    rows, done = [], {}  # a point whose settings are another's (each sweep holds the spec's own) is trained once
    print(f"{args.rung}: lift over the shuffled control at the last step, seeds {args.seeds}", flush=True)
    for name in args.sweeps:
        for label, changes in sweep_points(name, runner.spec["grpo"]):
            key = json.dumps({**runner.spec["grpo"], **changes}, sort_keys=True)
            r = done[key] = done.get(key) or lift(runner, args.rung, changes, args.seeds)
            rows.append(
                {
                    "sweep": name,
                    "point": label,
                    **{k: v for k, v in r.items() if k != "per_seed"},
                    "per_seed": " ".join(f"{x:+.4f}" for x in r["per_seed"]),
                }
            )
            print(
                f"  {name:7s} {label:24s} {r['lift']:+.4f} +- {r['se']:.4f}  [{r['min']:+.4f}, {r['max']:+.4f}]"
                f"  {r['cpu_s']:.1f} CPU-s a run",
                flush=True,
            )
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def _tiny_runner() -> Runner:
    """A random 8-px toy policy on the default world's vocabulary, saved to a temporary folder, and a spec for it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers import PROMPT_SET, tiny_policy

    folder = Path(tempfile.mkdtemp(prefix="climb-settings-test-"))
    tiny_policy("flow", seed=100, image_size=8, patch_size=2).save_pretrained(folder / "policy")
    grpo = {
        "steps": 2,
        "batch_prompts": 2,
        "group_size": 4,
        "lr": 1e-3,
        "mask_steps": 2,
        "diffusion_steps": 3,
        "micro_batches": 1,
        "grad_variance": False,
        "val_prompts": 2,
        "val_every": 2,
        "save_every": 2,
    }
    spec = {
        "grpo": grpo,
        "variant": {},
        "reward": {"weights": {"redness": 1.0}},
        "sampling": {"ar_steps": 2, "diffusion_steps": 3, "final_step_noise": True},
    }
    runner = Runner(spec, folder, folder / "policy")
    runner.train = runner.val = PROMPT_SET
    return runner


if __name__ == "__main__":
    main()
