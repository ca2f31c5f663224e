"""`margrpo eval-compbench`: CompBench-style scores of a samples directory (ShapesWorld parser).

Writes a per-image CSV (every score term) and a per-category CSV (category, n_images, strict,
lenient), both atomically. The world is read from world.json beside the suite unless --world.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from margrpo.io import atomic_write_csv


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples-dir", required=True, help="folder of {prompt}_{index:06d}.png (or its parent holding samples/)")
    parser.add_argument("--suite", required=True, help="the suite JSONL the samples were drawn from")
    parser.add_argument("--out-per-image", required=True, help="CSV, one row per image")
    parser.add_argument("--out-per-category", required=True, help="CSV, one row per category")
    parser.add_argument("--world", default=None, help="world.json (default: next to --suite)")


def run(args: argparse.Namespace) -> None:
    from margrpo.evaluation.toy_compbench import evaluate_samples
    from margrpo.world import WorldConfig

    cfg = WorldConfig.from_dict(json.loads(Path(args.world).read_text())) if args.world else None
    per_image, per_category = evaluate_samples(args.samples_dir, args.suite, cfg)
    atomic_write_csv(per_image, args.out_per_image)
    atomic_write_csv(per_category, args.out_per_category)
    print(per_category.to_string(index=False, float_format=lambda v: f"{v:.4f}"))


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(_parser)
    run(_parser.parse_args())
