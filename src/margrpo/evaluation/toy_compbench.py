"""CompBench-style evaluation of ShapesWorld samples with the exact parser.

Reads the T2I-CompBench layout `samples/{prompt}_{index:06d}.png`: the prompt is parsed back from
the file name and matched by text to the suite record, whose spec and category the image is
scored against (`margrpo.world.score`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from margrpo.evaluation.samples import complete_samples, evaluated_records
from margrpo.prompts.suites import load_suite
from margrpo.world import CATEGORIES, WorldConfig, heldout_in_spec, score

PER_IMAGE_COLUMNS = [
    "file",
    "prompt",
    "index",
    "category",
    "unseen",
    "strict",
    "lenient",
    "binding",
    "relation",
    "count",
    "n_objects",
    "n_expected",
    "extra_objects",
    "fragments",
]


def world_for_suite(suite_path: str | Path) -> WorldConfig:
    """The WorldConfig saved beside a suite (world.json, written by make-suites), else the default."""
    world = Path(suite_path).with_name("world.json")
    return WorldConfig.from_dict(json.loads(world.read_text())) if world.exists() else WorldConfig()


def evaluate_samples(
    samples_dir: str | Path,
    suite_path: str | Path,
    cfg: WorldConfig | None = None,
    *,
    images_per_prompt: int,
    max_prompts: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-image table, per-category table) of the samples against the suite: its first `max_prompts`
    prompts (0: all), each `images_per_prompt` times exactly (`complete_samples`).

    Per category: category, n_images, strict (mean), lenient (mean), in CATEGORIES order; the
    per-image table has every score term plus `unseen` (the prompt binds a held-out pair).
    """
    cfg = cfg or world_for_suite(suite_path)
    suite = load_suite(suite_path)
    records = {r.prompt: r for r in suite}
    heldout = cfg.heldout_pairs()
    rows = []
    prompts = [r.prompt for r in evaluated_records(suite, max_prompts)]
    for sample in complete_samples(
        samples_dir, prompts, images_per_prompt, suite_path
    ):  # names checked: {prompt}_{index:06d}.png
        path = sample.path
        record = records[sample.prompt]
        with Image.open(path) as im:
            image = np.asarray(im.convert("RGB"))  # (H, W, 3) uint8
        result = score(record.spec, image, record.category, cfg)
        rows.append(
            {
                "file": path.name,
                "prompt": record.prompt,
                "index": sample.index,
                "category": record.category,
                "unseen": heldout_in_spec(record.spec, heldout),
                **result,
            }
        )
    per_image = pd.DataFrame(rows, columns=PER_IMAGE_COLUMNS)
    per_category = (
        per_image.groupby("category", sort=False)
        .agg(n_images=("file", "size"), strict=("strict", "mean"), lenient=("lenient", "mean"))
        .reindex([c for c in CATEGORIES if c in set(per_image["category"])])
        .reset_index()
    )
    return per_image, per_category
