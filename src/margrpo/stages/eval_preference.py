"""`margrpo eval-preference`: preference-model scores (registry scorers) of a samples directory."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from margrpo.stages._common import json_arg, reward_options, setup

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples-dir", required=True, help="samples/{prompt}_{index:06d}.png")
    p.add_argument("--suite", required=True, help="the suite the samples were drawn from (metadata for scorers)")
    p.add_argument(
        "--images-per-prompt", type=int, required=True, help="images of each prompt (as `margrpo sample` drew)"
    )
    p.add_argument(
        "--max-prompts", type=int, default=0, help="the first prompts of the suite that were sampled; 0 = all"
    )
    p.add_argument(
        "--scorers", required=True, help="comma-separated registry names, e.g. toyclip or hpsv2,imagereward"
    )
    p.add_argument("--options-json", default="{}", help="scorer options (local weight paths) by name")
    p.add_argument("--toyclip-dir", default=None)
    p.add_argument("--toypref-dir", default=None)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--out", required=True, help="CSV: scorer, mean, std, n")
    p.add_argument("--threads", type=int, default=None)


def read_samples(
    samples_dir: str | Path, suite: str | Path, images_per_prompt: int, max_prompts: int = 0
) -> tuple[list[Path], list[str]]:
    """The files and prompts of a complete sample set of the suite (`complete_samples`), as eval-compbench reads it."""
    from margrpo.evaluation.samples import complete_samples, evaluated_records
    from margrpo.prompts.suites import load_suite

    prompts = [r.prompt for r in evaluated_records(load_suite(suite), max_prompts)]
    samples = complete_samples(samples_dir, prompts, images_per_prompt, suite)
    return [s.path for s in samples], [s.prompt for s in samples]


def run(args) -> None:
    import pandas as pd

    from margrpo.infra.files import atomic_write_csv
    from margrpo.prompts.suites import load_suite
    from margrpo.rewards import build_reward

    setup(args.threads)
    files, prompts = read_samples(args.samples_dir, args.suite, args.images_per_prompt, args.max_prompts)
    meta_by_prompt = {r.prompt: {"category": r.category, "spec": r.spec} for r in load_suite(args.suite)}
    names = [n for n in args.scorers.split(",") if n]
    options = reward_options(
        {n: 1.0 for n in names},
        json_arg(args.options_json, "--options-json", section="reward_models"),
        args.toyclip_dir,
        args.toypref_dir,
    )
    rows = []
    for name in names:
        scorer = build_reward(name, **options.get(name, {}))
        scores = []
        for a in range(0, len(files), args.batch_size):
            batch = files[a : a + args.batch_size]
            images = (
                torch.from_numpy(np.stack([np.asarray(Image.open(f).convert("RGB")) for f in batch]))
                .permute(0, 3, 1, 2)
                .float()
                / 255
            )
            ps = prompts[a : a + args.batch_size]
            scores.append(scorer(images, ps, [meta_by_prompt[p] for p in ps]))
        s = torch.cat(scores).float()
        if not torch.isfinite(s).all():
            raise SystemExit(f"scorer {name!r} returned non-finite scores")
        rows.append(
            {"scorer": name, "mean": s.mean().item(), "std": s.std().item() if len(s) > 1 else 0.0, "n": len(s)}
        )
        log.info(f"{name}: {rows[-1]['mean']:.4f} over {len(s)} images")
    atomic_write_csv(pd.DataFrame(rows), args.out)
