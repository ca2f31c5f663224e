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

from margrpo.evaluation.samples import list_samples
from margrpo.prompts.suites import load_suite
from margrpo.world import CATEGORIES, WorldConfig, heldout_in_spec, score

PER_IMAGE_COLUMNS = [
    "file", "prompt", "index", "category", "unseen", "strict", "lenient", "binding", "relation", "count",
    "n_objects", "n_expected", "extra_objects", "fragments",
]


def world_for_suite(suite_path: str | Path) -> WorldConfig:
    """The WorldConfig saved beside a suite (world.json, written by make-suites), else the default."""
    world = Path(suite_path).with_name("world.json")
    return WorldConfig.from_dict(json.loads(world.read_text())) if world.exists() else WorldConfig()


def evaluate_samples(
    samples_dir: str | Path, suite_path: str | Path, cfg: WorldConfig | None = None
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-image table, per-category table) of the samples against the suite.

    Per category: category, n_images, strict (mean), lenient (mean), in CATEGORIES order; the
    per-image table has every score term plus `unseen` (the prompt binds a held-out pair).
    """
    cfg = cfg or world_for_suite(suite_path)
    records = {r.prompt: r for r in load_suite(suite_path)}
    heldout = cfg.heldout_pairs()
    rows = []
    for sample in list_samples(samples_dir):  # names checked: {prompt}_{index:06d}.png
        path = sample.path
        record = records.get(sample.prompt)
        if record is None:
            raise ValueError(f"{path}: prompt {sample.prompt!r} is not in the suite {suite_path}")
        with Image.open(path) as im:
            image = np.asarray(im.convert("RGB"))  # (H, W, 3) uint8
        result = score(record.spec, image, record.category, cfg)
        rows.append({"file": path.name, "prompt": record.prompt, "index": sample.index, "category": record.category,
                     "unseen": heldout_in_spec(record.spec, heldout), **result})
    per_image = pd.DataFrame(rows, columns=PER_IMAGE_COLUMNS)
    per_category = (
        per_image.groupby("category", sort=False)
        .agg(n_images=("file", "size"), strict=("strict", "mean"), lenient=("lenient", "mean"))
        .reindex([c for c in CATEGORIES if c in set(per_image["category"])])
        .reset_index()
    )
    return per_image, per_category
