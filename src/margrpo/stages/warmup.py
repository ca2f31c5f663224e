"""`margrpo warmup`: fine-tune only the diffusion head before RL (Harmon warm-up, design.md §3.11).

The quality report records the policy before and after, so the effect of the warm-up is a number: among them the
share of images with no object of a palette colour (`no_valid_object`, evaluation.failures), the failure the paper
warms Harmon's head up to repair.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from margrpo.stages._common import json_arg, sampling_config, setup, stage_args, write_spec
from margrpo.stages.pretrain import load_world, world_batches, write_policy, write_sample_grid

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy-dir", required=True, help="the pre-trained (or loaded) policy")
    p.add_argument("--world", required=True, help="world.json (head training data)")
    p.add_argument("--eval-suite", required=True)
    p.add_argument("--warmup-json", required=True, help='{"steps": 400, "lr": 1e-6, "batch_size": 64}')
    p.add_argument(
        "--sampling-json",
        default=None,
        help="sampling settings for the quality report (default: the policy's pre-training config)",
    )
    p.add_argument("--out-dir", required=True)
    p.add_argument("--quality", required=True)
    p.add_argument("--samples-png", default=None, help="grid of quality-report samples with their prompts")
    p.add_argument("--precision", default="bf16", choices=["no", "bf16", "fp16"])
    p.add_argument("--quality-images", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)


def run(args) -> None:
    from margrpo.evaluation.quality import format_report
    from margrpo.infra.files import atomic_write_json
    from margrpo.policy import load_policy
    from margrpo.prompts.suites import load_suite
    from margrpo.toylab.pretraining import PretrainConfig, train

    device = setup(args.threads)
    w = json_arg(args.warmup_json, "--warmup-json", section="policies.*.warmup")
    sampling_json = (
        json_arg(args.sampling_json, "--sampling-json", section="policies.*.sampling") if args.sampling_json else {}
    )
    world_cfg = load_world(args.world)
    policy = load_policy(args.policy_dir, device)
    sampling = sampling_config(sampling_json)
    out = Path(args.out_dir)
    write_spec(
        out.parent,
        {**stage_args(args), "warmup_json": w, "sampling_json": sampling_json, "world": world_cfg.to_dict()},
    )
    records = load_suite(args.eval_suite)
    before = quality_with_failures(policy, records, sampling, args, world_cfg)[0]
    cfg = PretrainConfig(
        steps=w["steps"],
        lr=w["lr"],
        batch_size=w["batch_size"],
        train_ar=False,
        diffusion_batch_mul=w.get("diffusion_batch_mul", 4),
        warmup_steps=min(50, w["steps"]),
        seed=args.seed,
        precision=args.precision,
    )
    state = out.parent / "state"
    train(
        policy,
        world_batches(world_cfg),
        cfg,
        state,
        log_path=state / "log.csv",
        spec={"policy_dir": str(args.policy_dir), "world": world_cfg.to_dict()},
    )
    write_policy(policy, out)
    after, images = quality_with_failures(policy, records, sampling, args, world_cfg)
    atomic_write_json(args.quality, {**after, "before_warmup": before})
    if args.samples_png:
        title = f"{out.parent.name}: after head warm-up ({cfg.steps} steps)"
        write_sample_grid(records, images, args.quality_images, args.samples_png, title)
    log.info(format_report(after))
    log.info(
        f"warm-up: overall strict {before['overall']['strict']:.3f} -> {after['overall']['strict']:.3f}, images with "
        f"no valid object {before['no_valid_object']:.3f} -> {after['no_valid_object']:.3f}"
    )


def quality_with_failures(policy, records, sampling, args, world_cfg) -> tuple[dict, object]:
    """The quality report of `policy` on the evaluation suite's `records`, with its share of failed images; and the
    images."""
    from margrpo.evaluation.failures import failed_share
    from margrpo.evaluation.quality import quality_report

    report, images = quality_report(
        policy,
        records,
        sampling,
        args.quality_images,
        world_cfg=world_cfg,
        precision=args.precision,
    )
    report["no_valid_object"] = failed_share(images, world_cfg)
    return report, images
