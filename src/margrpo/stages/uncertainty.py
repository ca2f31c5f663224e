"""`margrpo uncertainty`: per-token MTE uncertainty of a policy's samples (the data of Fig. 4)."""

from __future__ import annotations

import argparse
import logging

import numpy as np
import torch

from margrpo.stages._common import json_arg, sampling_config, setup

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", required=True)
    p.add_argument("--suite", required=True)
    p.add_argument("--sampling-json", required=True)
    p.add_argument("--prompts", type=int, default=6, help="first N prompts of the suite")
    p.add_argument("--trajectories", type=int, default=4, help="S")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        required=True,
        help=(
            ".npz: images, uncertainty [P, h, w] (at each token's committing step), prompts, trajectories, "
            "step_uncertainty [P, K, h, w]"
        ),
    )
    p.add_argument("--threads", type=int, default=None)


def run(args) -> None:
    from margrpo.grpo.objective import token_uncertainty
    from margrpo.grpo.rollout import generate
    from margrpo.infra.files import atomic_path
    from margrpo.policy import load_policy
    from margrpo.prompts.suites import load_suite

    device = setup(args.threads)
    policy = load_policy(args.policy, device)
    prompts = [r.prompt for r in load_suite(args.suite)[: args.prompts]]
    g = torch.Generator().manual_seed(args.seed)
    # MTE at every AR step: u^k of every token predicted at step k (Algorithm 2)
    r = generate(
        policy,
        prompts,
        sampling_config(json_arg(args.sampling_json, "--sampling-json")),
        generator=g,
        trajectories=args.trajectories,
        mte_generator=torch.Generator().manual_seed(args.seed + 1),
    )
    finals = r.mte_finals()  # [K, S, P, L, D], index 0 the rollout's own sample at step k
    # [K, P, L], design.md §3.9; 0 where known
    step_maps = token_uncertainty(finals.transpose(0, 1)) * r.mte_candidates()
    committed = r.committed.float()  # [K, P, L], one step per token
    u = (step_maps * committed).sum(0)  # [P, L]: each token's uncertainty at the step that commits it
    # trajectory s: every token as drawn by the s-th trajectory of the step that commits it (s = 0: the sample)
    per_traj = (finals * committed[:, None, :, :, None]).sum(0)  # [S, P, L, D]
    h, w = policy.token_grid

    def to_uint8(x):
        return (x.clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy()

    trajectories = np.stack([to_uint8(policy.decode(f)) for f in per_traj], axis=1)  # [P, S, H, W, 3]
    with atomic_path(args.out) as tmp:
        with open(tmp, "wb") as f:
            np.savez(
                f,
                images=to_uint8(r.images),
                uncertainty=u.view(-1, h, w).cpu().numpy(),
                prompts=np.array(prompts),
                trajectories=trajectories,
                step_uncertainty=step_maps.transpose(0, 1).reshape(len(prompts), -1, h, w).cpu().numpy(),
            )
    log.info(f"uncertainty maps of {len(prompts)} prompts (S = {args.trajectories}) -> {args.out}")
