"""`margrpo eval-compbench`: CompBench-style scores of a samples directory.

Two evaluators behind one output format: `shapesworld` (the toy world's exact scene parser) and
`t2i-compbench` (real images: BLIP-VQA, Grounding DINO and CLIP, margrpo.evaluation.compbench).
Writes a per-image CSV (every score term) and a per-category CSV (category, n_images, strict,
lenient), both atomically. T2I-CompBench has one score per category: strict and lenient then hold
the same number. The toy world is read from world.json beside the suite unless --world.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from margrpo.infra.files import atomic_write_csv

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--samples-dir", required=True, help="folder of {prompt}_{index:06d}.png (or its parent holding samples/)"
    )
    parser.add_argument("--suite", required=True, help="the suite JSONL the samples were drawn from")
    parser.add_argument("--out-per-image", required=True, help="CSV, one row per image")
    parser.add_argument("--out-per-category", required=True, help="CSV, one row per category")
    parser.add_argument(
        "--images-per-prompt", type=int, required=True, help="images of each prompt (as `margrpo sample` drew)"
    )
    parser.add_argument(
        "--max-prompts", type=int, default=0, help="the first prompts of the suite that were sampled; 0 = all"
    )
    parser.add_argument("--world", default=None, help="world.json (default: next to --suite)")
    parser.add_argument("--evaluator", choices=("shapesworld", "t2i-compbench"), default="shapesworld")
    parser.add_argument(
        "--models-json",
        default="{}",
        help=(
            "t2i-compbench: {vqa: {path, ...}, detector: {path, ...}, clip: {path, ...}, prompts_dir, device, "
            "batch_size}"
        ),
    )


def run(args: argparse.Namespace) -> None:
    if args.evaluator == "t2i-compbench":
        return run_real(args)
    from margrpo.evaluation.toy_compbench import evaluate_samples
    from margrpo.world import WorldConfig

    cfg = WorldConfig.from_dict(json.loads(Path(args.world).read_text())) if args.world else None
    per_image, per_category = evaluate_samples(
        args.samples_dir, args.suite, cfg, images_per_prompt=args.images_per_prompt, max_prompts=args.max_prompts
    )
    atomic_write_csv(per_image, args.out_per_image)
    atomic_write_csv(per_category, args.out_per_category)
    log.info(per_category.to_string(index=False, float_format=lambda v: f"{v:.4f}"))


def run_real(args: argparse.Namespace) -> None:
    """Score each evaluation category with its T2I-CompBench metric; one model of each kind, built once."""
    import pandas as pd

    from margrpo.evaluation.compbench import MODEL_METRICS, CompBenchEvaluator, canonical_category, needed_models
    from margrpo.evaluation.samples import complete_samples, evaluated_records
    from margrpo.prompts.suites import load_suite
    from margrpo.stages._common import json_arg

    models = json_arg(args.models_json, "--models-json", section="evaluation.compbench_models")
    records = evaluated_records(load_suite(args.suite), args.max_prompts)
    category_of = {r.prompt: canonical_category(r.category) for r in records}
    samples = complete_samples(args.samples_dir, [r.prompt for r in records], args.images_per_prompt, args.suite)
    cats = sorted(set(category_of[s.prompt] for s in samples))
    missing = [k for k in needed_models(cats) if k not in models]
    if missing:
        raise SystemExit(
            f"evaluating {cats} needs evaluation.compbench_models entries {missing} (local model folders)"
        )
    options = {k: dict(models[k]) for k in MODEL_METRICS if k in models}
    for kind, opts in options.items():
        if "path" not in opts:
            raise SystemExit(f"evaluation.compbench_models.{kind} needs a 'path' (a local model folder)")
    paths = {f"{kind}_path": opts.pop("path") for kind, opts in options.items()}
    evaluator = CompBenchEvaluator.from_paths(
        cats,
        **paths,
        prompts_dir=models.get("prompts_dir"),
        device=models.get("device", "cpu"),
        batch_size=int(models.get("batch_size", 8)),
        **{f"{kind}_options": opts for kind, opts in options.items()},
    )
    per_image, per_category = [], []
    for cat in cats:
        table, summary = evaluator.evaluate_samples([s for s in samples if category_of[s.prompt] == cat], cat)
        per_image.append(table)
        per_category.append(
            {"category": cat, "n_images": summary["n_images"], "strict": summary["mean"], "lenient": summary["mean"]}
        )
        log.info(f"{cat}: {summary['mean']:.4f} over {summary['n_images']} images ({summary['metric']})")
    atomic_write_csv(pd.concat(per_image, ignore_index=True), args.out_per_image)
    atomic_write_csv(pd.DataFrame(per_category), args.out_per_category)
