"""`margrpo sample`: images of a prompt suite in the T2I-CompBench layout, samples/{prompt}_{index:06d}.png."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from PIL import Image

from margrpo.infra.files import InputError, atomic_dir
from margrpo.stages._common import json_arg, sampling_config, setup

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy", required=True, help="policy folder, policy.json pointer, or selection.json from `margrpo select`"
    )
    p.add_argument("--suite", required=True)
    p.add_argument("--sampling-json", required=True)
    p.add_argument("--images-per-prompt", type=int, default=1, help="at least 1")
    p.add_argument("--max-prompts", type=int, default=0, help="0 = every prompt of the suite")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--precision", default="bf16", choices=["no", "bf16", "fp16"])
    p.add_argument("--seed", type=int, default=1234, help="the same seed for every model: paired comparisons")
    p.add_argument("--out-dir", required=True, help="the samples/ folder")
    p.add_argument("--threads", type=int, default=None)


def resolve_policy(path: str) -> str:
    """A selection.json (from `margrpo select`) points at the chosen checkpoint's policy folder."""
    from margrpo.infra.files import read_json

    p = Path(path)
    if p.suffix == ".json" and p.name == "selection.json":
        chosen = read_json(p).get("policy")
        if chosen is None:
            raise SystemExit(f"{p}: the selection has no checkpoint folder")
        return chosen
    return path


def policy_sampling(policy, text: str):
    """The sampling settings of --sampling-json for this policy: MaskSamplingConfig fields for a toy-mask
    policy, the schema's `policies.*.sampling` (SamplingConfig) for every MAR policy."""
    from margrpo.related.maskgrpo.policy import ToyMaskPolicy
    from margrpo.stages._related import mask_sampling

    value = json_arg(text, "--sampling-json")
    return mask_sampling(value, "--sampling-json") if isinstance(policy, ToyMaskPolicy) else sampling_config(value)


def run(args) -> None:
    from margrpo.evaluation.quality import sample_images
    from margrpo.evaluation.samples import evaluated_records
    from margrpo.prompts.suites import load_suite
    from margrpo.stages._related import load_any_policy

    if args.images_per_prompt < 1:
        raise InputError(
            f"--images-per-prompt: {args.images_per_prompt}; expected at least 1 "
            "(the config's evaluation.images_per_prompt)"
        )
    records = evaluated_records(load_suite(args.suite), args.max_prompts)  # --max-prompts checked like the config's
    device = setup(args.threads)
    policy = load_any_policy(resolve_policy(args.policy), device)
    prompts = [r.prompt for r in records]
    images = sample_images(
        policy,
        prompts,
        policy_sampling(policy, args.sampling_json),
        args.images_per_prompt,
        args.seed,
        args.batch_size,
        args.precision,
    )
    out = Path(args.out_dir)
    with atomic_dir(out) as tmp:
        for i, img in enumerate(images):
            prompt, index = prompts[i // args.images_per_prompt], i % args.images_per_prompt
            Image.fromarray(img).save(tmp / f"{prompt}_{index:06d}.png")
    log.info(f"{len(images)} images of {len(prompts)} prompts -> {out}")
