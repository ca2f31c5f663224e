"""`margrpo pretrain`: a toy MAR base policy trained from scratch on ShapesWorld, with its quality report."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

import numpy as np
import torch

from margrpo.infra.files import atomic_dir, atomic_path
from margrpo.stages._common import json_arg, sampling_config, setup, stage_args, write_spec

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world", required=True, help="world.json written by make-suites")
    p.add_argument("--eval-suite", required=True, help="suite for the quality report (eval.jsonl)")
    p.add_argument(
        "--policy-json", required=True, help="the policy's config entry (kind, head, model, pretrain, sampling)"
    )
    p.add_argument("--out-dir", required=True, help="policy folder (save_pretrained); resume state goes beside it")
    p.add_argument("--quality", required=True, help="quality report JSON (per-category scores, shuffled baseline)")
    p.add_argument("--samples-png", default=None, help="grid of quality-report samples with their prompts")
    p.add_argument("--precision", default="bf16", choices=["no", "bf16", "fp16"])
    p.add_argument("--quality-images", type=int, default=4, help="images per eval prompt for the quality report")
    p.add_argument("--threads", type=int, default=None)


def world_batches(world_cfg):
    """(images [B, 3, H, W] in [0, 1], prompts) of random captioned scenes, drawn from the torch generator."""
    from margrpo.world import render
    from margrpo.world.captions import sample_captioned

    def batch(n: int, generator: torch.Generator):
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (), generator=generator)))
        pairs = [sample_captioned(rng, world_cfg) for _ in range(n)]
        images = np.stack([render(scene, world_cfg) for scene, *_ in pairs])
        return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255, [prompt for _, prompt, _, _ in pairs]

    return batch


CODEC_SCENES, CODEC_SEED = 2000, 20261201  # the latent codec's fit: one set of renders for every base of a world


def fit_world_codec(policy, world_cfg) -> float | None:
    """Fit a latent-token policy's frozen codec on CODEC_SCENES renders of the world, the same renders for every
    base (so toy-nova and toy-harmon share one codec, as a world has one VAE): the variance kept, or None for
    pixel tokens."""
    if policy.codec is None:
        return None
    images, _ = world_batches(world_cfg)(CODEC_SCENES, torch.Generator().manual_seed(CODEC_SEED))
    kept = policy.fit_codec(images)
    log.info(f"latent codec: {policy.token_dim} channels a token keep {kept:.4f} of the patches' variance")
    return kept


def load_world(path):
    from margrpo.infra.files import read_json
    from margrpo.world import WorldConfig

    return WorldConfig.from_dict(read_json(path))


def write_policy(policy, out_dir: Path) -> None:
    """save_pretrained into a temp folder, then rename: a half-written policy is never left behind."""
    with atomic_dir(out_dir) as tmp:
        policy.save_pretrained(tmp)


def write_quality(policy, args, sampling, path, extra: dict | None = None, world_cfg=None, title: str = "") -> dict:
    from margrpo.evaluation.quality import format_report, quality_report
    from margrpo.infra.files import atomic_write_json
    from margrpo.prompts.suites import load_suite

    records = load_suite(args.eval_suite)
    report, images = quality_report(
        policy, records, sampling, args.quality_images, world_cfg=world_cfg, precision=args.precision
    )
    report.update(extra or {})
    atomic_write_json(path, report)
    if args.samples_png:
        write_sample_grid(records, images, args.quality_images, args.samples_png, title)
    log.info(format_report(report))
    return report


def write_sample_grid(records, images, per_prompt: int, path, title: str, per_category: int = 2) -> None:
    """Two prompts of every category, all their quality-report images, prompts as row labels."""
    from margrpo.reporting.figures import plot_sample_grid

    rows, seen = [], {}
    for i, r in enumerate(records):
        if seen.get(r.category, 0) < per_category:
            seen[r.category] = seen.get(r.category, 0) + 1
            rows.append(i)
    cells = [[images[i * per_prompt + j] for j in range(per_prompt)] for i in rows]
    labels = [f"[{records[i].category}] {records[i].prompt}" for i in rows]
    fig = plot_sample_grid(cells, labels, [f"sample {j + 1}" for j in range(per_prompt)], title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def run(args) -> None:
    from margrpo.policy import ToyMAR, ToyMARConfig
    from margrpo.policy.toy import count_parameters
    from margrpo.toylab.pretraining import PretrainConfig, train
    from margrpo.world import prompt_vocabulary

    spec = json_arg(args.policy_json, "--policy-json", section="policies.*")
    if spec["kind"] != "toy":
        raise SystemExit(f"pretrain builds toy policies only; a {spec['kind']} policy loads from its path")
    device = setup(args.threads)
    world_cfg = load_world(args.world)
    model_cfg = ToyMARConfig(
        head_type=spec["head"], image_size=world_cfg.image_size, vocab=prompt_vocabulary(), **spec["model"]
    )
    pre = spec["pretrain"]
    cfg = PretrainConfig(
        steps=pre["steps"],
        batch_size=pre["batch_size"],
        lr=pre["lr"],
        seed=pre["seed"],
        head_steps=pre["head_steps"],
        mask_ratio_min=pre["mask_ratio_min"],
        mask_ratio_std=pre["mask_ratio_std"],
        diffusion_batch_mul=pre["diffusion_batch_mul"],
        precision=args.precision,
    )
    torch.manual_seed(cfg.seed)
    policy = ToyMAR(model_cfg)
    fit_world_codec(policy, world_cfg)
    policy = policy.to(device)
    log.info(
        f"toy MAR ({spec['head']} head): {count_parameters(policy) / 1e6:.2f}M parameters, "
        f"head {count_parameters(policy.diffloss) / 1e6:.2f}M, {policy.seq_len} tokens x {policy.token_dim}"
    )
    out = Path(args.out_dir)
    state = out.parent / "state"
    write_spec(out.parent, {**stage_args(args), "policy_json": spec, "world": world_cfg.to_dict()})
    train(
        policy,
        world_batches(world_cfg),
        cfg,
        state,
        log_path=state / "log.csv",
        spec={"model": dataclasses.asdict(model_cfg), "world": world_cfg.to_dict()},
    )
    write_policy(policy, out)
    write_quality(
        policy,
        args,
        sampling_config(spec["sampling"]),
        args.quality,
        {"pretrain": dataclasses.asdict(cfg)},
        world_cfg,
        title=f"{out.parent.name}: pre-trained ({cfg.steps} steps)",
    )
