"""MARVAL-RL on a distilled toy-nova: a few reward-gradient steps on the mixed reward (toyclip + shapes).

Prints one metrics row per step (the GRPO trainer's column names where they apply) and writes them to
--out as CSV.

    PYTHONPATH=src python benchmarks/marval_rl_toy.py --policy /tmp/marval/policy \
        --toyclip results/toyclip/toyclip-<hash8>/model --data results/data/shapesworld-<hash8> --steps 20
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from margrpo.grpo.rollout import SamplingConfig
from margrpo.infra.files import atomic_write_rows, read_json
from margrpo.policy import load_policy
from margrpo.prompts.suites import PromptSet, load_suite
from margrpo.related.marval import MARVALRL, MARVALRLConfig
from margrpo.rewards.toyclip import ToyClip
from margrpo.world import WorldConfig
from margrpo.world.reward import ShapesReward


def prompt_set(path: Path) -> PromptSet:
    records = load_suite(path)
    return PromptSet([r.prompt for r in records], [{"spec": r.spec, "category": r.category} for r in records])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", required=True, help="a one-step policy folder (benchmarks/marval_toy.py writes one)")
    ap.add_argument("--toyclip", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--shapes-grad", default="reinforce")
    ap.add_argument("--ar-steps", type=int, default=8)
    ap.add_argument("--out", default="/tmp/marval_rl/metrics.csv")
    args = ap.parse_args()
    torch.set_num_threads(1)
    policy = load_policy(args.policy)
    world = WorldConfig.from_dict(read_json(Path(args.data) / "world.json"))
    sampling = dataclasses.replace(SamplingConfig(), ar_steps=args.ar_steps, diffusion_steps=2, cfg_scale=1.0)
    cfg = MARVALRLConfig(steps=args.steps, lr=args.lr, shapes_grad=args.shapes_grad, val_every=5, val_prompts=24)
    rl = MARVALRL(
        policy,
        ToyClip.from_pretrained(args.toyclip),
        ShapesReward(world=world),
        prompt_set(Path(args.data) / "train.jsonl"),
        prompt_set(Path(args.data) / "val.jsonl"),
        sampling,
        cfg,
    )
    base = rl.validate()
    print(f"val_reward at step 0: {base:.4f}", flush=True)
    rows = rl.train()
    for r in rows:
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}, flush=True)
    atomic_write_rows(args.out, [{"step": 0, "val_reward": base}, *rows])


if __name__ == "__main__":
    main()
