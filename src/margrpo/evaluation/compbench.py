"""T2I-CompBench evaluation of real samples, with the scorers of `margrpo.rewards.real`.

Input: a folder of `{prompt}_{index:06d}.png` (T2I-CompBench's layout; the prompt is read back
from the file name) and a category. Per category, the metric T2I-CompBench uses, with Grounding
DINO standing in for its UniDet detector:

| category | metric | per-image score |
|---|---|---|
| color, shape, texture | BLIP-VQA | product over the prompt's noun phrases of P(yes \\| "{phrase}?") |
| spatial (2-D) | detection | 0.25 conf(obj1) + 0.25 conf(obj2) + relation_score / 2, set to 0 below 0.5 |
| numeracy | detection | mean over objects of 0.5 (detected) + 0.5 (NMS count == asked) |
| non_spatial | CLIP | cosine(image, prompt) |
| complex | 3-in-1 | mean of the attribute (BLIP-VQA), spatial and non-spatial scores |

For complex, T2I-CompBench averages only two of the three for its "spatial" and "action"
sub-splits (attribute + spatial, attribute + non-spatial); give `prompts_dir` (the folder of
complex_val_spatial.txt and complex_val_action.txt) to follow that rule, otherwise every complex
prompt averages all three. Documented differences from the original: noun phrases and object
names come from the rules of `margrpo.rewards.real` instead of spaCy; detections are Grounding
DINO queries whose phrase score exceeds the detector's box_threshold, counted after NMS at its
nms_iou (0.5, as T2I-R1; UniDet has its own NMS and T2I-CompBench then merges boxes of IoU > 0.9);
complex's non-spatial part scores the whole prompt (T2I-CompBench drops adjectives with a POS tagger).
3d_spatial needs a depth model (UniDet + DPT) and is not supported.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from margrpo.evaluation.samples import Sample, list_samples, parse_sample_name
from margrpo.prompt_files import read_prompt_file
from margrpo.rewards.real import (
    BlipVQAReward,
    ClipScoreReward,
    Detections,
    GroundingDinoReward,
    Relation,
    count_match_score,
    parse_counts,
    parse_relation,
    relation_score,
)

__all__ = [
    "CATEGORIES",
    "METRICS",
    "CompBenchEvaluator",
    "Sample",
    "canonical_category",
    "compbench_numeracy_score",
    "compbench_spatial_score",
    "evaluate_directory",
    "list_samples",
    "parse_sample_name",
    "write_results",
]

CATEGORIES = ("color", "shape", "texture", "spatial", "numeracy", "non_spatial", "complex")
METRICS = {
    "color": "blip_vqa", "shape": "blip_vqa", "texture": "blip_vqa", "spatial": "detection_2d",
    "numeracy": "detection_count", "non_spatial": "clip", "complex": "3_in_1",
}
_ALIASES = {"2d_spatial": "spatial", "2d-spatial": "spatial", "non-spatial": "non_spatial", "nonspatial": "non_spatial"}
_UNSUPPORTED = {"3d_spatial": "3d_spatial needs a depth model (T2I-CompBench: UniDet + DPT); it is not supported"}
MODEL_METRICS = {"vqa": ("blip_vqa", "3_in_1"), "detector": ("detection_2d", "detection_count", "3_in_1"),
                 "clip": ("clip", "3_in_1")}  # which metrics each model serves
COMPLEX_SPLITS = {"spatial": "complex_val_spatial.txt", "action": "complex_val_action.txt"}


def canonical_category(category: str) -> str:
    """A category name (aliases: 2d_spatial, non-spatial) -> one of CATEGORIES."""
    name = _ALIASES.get(category.lower(), category.lower())
    if name in _UNSUPPORTED:
        raise ValueError(_UNSUPPORTED[name])
    if name not in CATEGORIES:
        raise ValueError(f"Unknown category: {category!r}; expected one of {CATEGORIES}")
    return name


def needed_models(categories: Sequence[str]) -> dict[str, str]:
    """Model kind ("vqa", "detector", "clip") -> the first of `categories` whose metric uses it."""
    needed: dict[str, str] = {}
    for category in map(canonical_category, categories):
        for kind, metrics in MODEL_METRICS.items():
            if METRICS[category] in metrics:
                needed.setdefault(kind, category)
    return needed


def _prompt_key(prompt: str) -> str:
    """T2I-CompBench's prompt matching for the complex sub-splits: first sentence, lower-cased."""
    return prompt.strip().split(".")[0].lower()


def _load_batches(samples: Sequence[Sample], batch_size: int):
    """Consecutive samples of one image size, at most batch_size: (samples, images [b, 3, H, W] in [0, 1])."""
    from PIL import Image

    batch: list[Sample] = []
    arrays: list[np.ndarray] = []
    for sample in samples:
        with Image.open(sample.path) as im:
            array = np.asarray(im.convert("RGB"))  # [H, W, 3] uint8
        if batch and (len(batch) == batch_size or array.shape != arrays[0].shape):
            yield batch, torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255
            batch, arrays = [], []
        batch.append(sample)
        arrays.append(array)
    if batch:
        yield batch, torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255


# ============================================================================ detection metrics


def compbench_spatial_score(
    dets: dict[str, Detections], rel: Relation, iou_threshold: float = 0.1, near_threshold: float = 0.3
) -> float:
    """T2I-CompBench's 2-D spatial score from detections (its UniDet rule, detector confidences).

    Both objects found: 0.25 * conf1 + 0.25 * conf2 + relation_score(best boxes) / 2; one found:
    0.25 * its confidence; none: 0. A score below 0.5 is set to 0 (so the relation must hold).
    """
    best1 = dets.get(rel.obj1, Detections()).best()
    best2 = dets.get(rel.obj2, Detections()).best()
    if best1 and best2:
        score = 0.25 * best1[1] + 0.25 * best2[1]
        score += relation_score(rel.relation, best1[0], best2[0], iou_threshold, near_threshold) / 2
    elif best1 or best2:
        score = 0.25 * (best1 or best2)[1]
    else:
        score = 0.0
    return score if score >= 0.5 else 0.0


def compbench_numeracy_score(
    dets: dict[str, Detections], counts: Sequence[tuple[str, int]], nms_iou: float = 0.5
) -> float:
    """T2I-CompBench's numeracy score: mean over objects of 0.5 (detected) + 0.5 (count after NMS == asked)."""
    return count_match_score(dets, counts, nms_iou, wrong=0.5) if counts else 0.0


# ============================================================================ evaluator


class CompBenchEvaluator:
    """T2I-CompBench scores of images: one method per metric, built from real.py scorers.

    `vqa` (BlipVQAReward, reduce "product"), `detector` (GroundingDinoReward) and `clip`
    (ClipScoreReward, form "cosine") are needed only by the categories that use them.
    `complex_spatial` / `complex_action`: the complex sub-split prompts (see the module docstring).
    """

    def __init__(
        self,
        vqa: BlipVQAReward | None = None,
        detector: GroundingDinoReward | None = None,
        clip: ClipScoreReward | None = None,
        complex_spatial: Sequence[str] = (),
        complex_action: Sequence[str] = (),
        batch_size: int = 8,
    ):
        self.vqa, self.detector, self.clip = vqa, detector, clip
        self.complex_spatial = {_prompt_key(p) for p in complex_spatial}
        self.complex_action = {_prompt_key(p) for p in complex_action}
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.batch_size = int(batch_size)

    @classmethod
    def from_paths(
        cls,
        category: str | Sequence[str],
        vqa_path: str | None = None,
        detector_path: str | None = None,
        clip_path: str | None = None,
        prompts_dir: str | None = None,
        device: str = "cpu",
        batch_size: int = 8,
        vqa_options: dict | None = None,
        detector_options: dict | None = None,
        clip_options: dict | None = None,
    ) -> CompBenchEvaluator:
        """Build only the models `category` (one or several) needs from local folders (see real.py for their files).

        `*_options`: further keyword options of BlipVQAReward / GroundingDinoReward / ClipScoreReward
        (e.g. processor_path, box_threshold).
        """
        categories = [category] if isinstance(category, str) else list(category)
        need = needed_models(categories)
        for kind, path, what in (("vqa", vqa_path, "vqa_path (BLIP-VQA)"),
                                 ("detector", detector_path, "detector_path (Grounding DINO)"),
                                 ("clip", clip_path, "clip_path (CLIP)")):
            if kind in need and path is None:
                raise ValueError(f"category {need[kind]!r} needs {what}")
        common = {"device": device, "batch_size": batch_size}
        vqa = BlipVQAReward(vqa_path, reduce="product", **common, **(vqa_options or {})) if "vqa" in need else None
        det = GroundingDinoReward(detector_path, **common, **(detector_options or {})) if "detector" in need else None
        clip = ClipScoreReward(clip_path, form="cosine", **common, **(clip_options or {})) if "clip" in need else None
        spatial, action = (), ()
        if "complex" in map(canonical_category, categories) and prompts_dir is not None:
            spatial, action = ([r.prompt for r in read_prompt_file(Path(prompts_dir) / COMPLEX_SPLITS[kind], "complex")]
                               for kind in ("spatial", "action"))
        return cls(vqa, det, clip, spatial, action, batch_size)

    # ------------------------------------------------------------------ per metric

    def _need(self, model: Any, what: str, category: str) -> Any:
        if model is None:
            raise ValueError(f"category {category!r} needs a {what}; pass it to CompBenchEvaluator")
        return model

    def attribute(self, images: Tensor, prompts: list[str]) -> Tensor:
        """BLIP-VQA: product over noun phrases of P(yes). [B]"""
        return self._need(self.vqa, "BLIP-VQA scorer (vqa=)", "attribute")(images, prompts, [{} for _ in prompts])

    def non_spatial(self, images: Tensor, prompts: list[str]) -> Tensor:
        """CLIP cosine(image, prompt). [B]"""
        return self._need(self.clip, "CLIP scorer (clip=)", "non_spatial")(images, prompts, [{} for _ in prompts])

    def spatial(self, images: Tensor, prompts: list[str]) -> tuple[Tensor, list[bool]]:
        """Detection 2-D spatial scores [B], and whether each prompt's relation was parsed."""
        det = self._need(self.detector, "Grounding DINO detector (detector=)", "spatial")
        relations = [parse_relation(p) for p in prompts]
        found = det.detect(images, [[r.obj1, r.obj2] if r else [] for r in relations])
        scores = [compbench_spatial_score(d, r, det.iou_threshold, det.near_threshold) if r else 0.0
                  for r, d in zip(relations, found)]
        return torch.tensor(scores, dtype=torch.float32), [r is not None for r in relations]

    def numeracy(self, images: Tensor, prompts: list[str]) -> tuple[Tensor, list[bool]]:
        """Detection count scores [B], and whether each prompt's counts were parsed."""
        det = self._need(self.detector, "Grounding DINO detector (detector=)", "numeracy")
        counts = [parse_counts(p) for p in prompts]
        found = det.detect(images, [list(dict.fromkeys(n for n, _ in c)) for c in counts])
        scores = [compbench_numeracy_score(d, c, det.nms_iou) for c, d in zip(counts, found)]
        return torch.tensor(scores, dtype=torch.float32), [bool(c) for c in counts]

    def complex_kind(self, prompt: str) -> str:
        """Which parts the 3-in-1 score averages: "spatial", "action" or "all"."""
        key = _prompt_key(prompt)
        if key in self.complex_spatial:
            return "spatial"
        if key in self.complex_action:
            return "action"
        return "all"

    def score(self, category: str, images: Tensor, prompts: list[str]) -> dict[str, list]:
        """Scores of one batch: {"score": [B], plus the category's components}, as Python lists."""
        category = canonical_category(category)
        metric = METRICS[category]
        if metric == "blip_vqa":
            return {"score": self.attribute(images, prompts).tolist()}
        if metric == "clip":
            return {"score": self.non_spatial(images, prompts).tolist()}
        if metric == "detection_2d":
            s, parsed = self.spatial(images, prompts)
            return {"score": s.tolist(), "parsed": parsed}
        if metric == "detection_count":
            s, parsed = self.numeracy(images, prompts)
            return {"score": s.tolist(), "parsed": parsed}
        # 3-in-1
        attr = self.attribute(images, prompts)
        spat, parsed = self.spatial(images, prompts)
        action = self.non_spatial(images, prompts)
        kinds = [self.complex_kind(p) for p in prompts]
        parts = {"spatial": (attr, spat), "action": (attr, action), "all": (attr, spat, action)}
        total = [float(torch.stack([t[i] for t in parts[k]]).mean()) for i, k in enumerate(kinds)]
        return {"score": total, "attribute": attr.tolist(), "spatial": spat.tolist(), "non_spatial": action.tolist(),
                "complex_kind": kinds, "parsed": parsed}

    def evaluate(self, samples_dir: str | Path, category: str) -> tuple[pd.DataFrame, dict]:
        """(per-image table, summary) of every sample in `samples_dir` for `category`.

        Per image: file, prompt, index, category, score and the category's components; summary:
        category, metric, n_images, n_prompts, mean (the category score), and for detection
        metrics n_unparsed (prompts whose objects the rules could not read; they score 0).
        """
        return self.evaluate_samples(list_samples(samples_dir), category)

    def evaluate_samples(self, samples: Sequence[Sample], category: str) -> tuple[pd.DataFrame, dict]:
        """`evaluate` on a list of samples (e.g. one category's share of a mixed folder)."""
        category = canonical_category(category)
        rows: list[dict] = []
        for batch, images in _load_batches(samples, self.batch_size):
            result = self.score(category, images, [s.prompt for s in batch])
            for i, s in enumerate(batch):
                rows.append({"file": s.path.name, "prompt": s.prompt, "index": s.index, "category": category,
                             **{k: v[i] for k, v in result.items()}})
        per_image = pd.DataFrame(rows)
        summary = {
            "category": category,
            "metric": METRICS[category],
            "n_images": len(per_image),
            "n_prompts": int(per_image["prompt"].nunique()),
            "mean": float(per_image["score"].mean()),
        }
        if "parsed" in per_image:
            summary["n_unparsed"] = int((~per_image["parsed"].astype(bool)).sum())
        return per_image, summary


def write_results(
    per_image: pd.DataFrame, summary: dict, out_json: str | Path | None = None, out_csv: str | Path | None = None
) -> None:
    """JSON {"summary": ..., "per_image": [...]} and/or the per-image CSV, each written atomically."""
    from margrpo.io import atomic_write_csv, atomic_write_json

    if out_json is not None:
        atomic_write_json(out_json, {"summary": summary, "per_image": per_image.to_dict(orient="records")})
    if out_csv is not None:
        atomic_write_csv(per_image, out_csv)


def evaluate_directory(
    samples_dir: str | Path,
    category: str,
    out_json: str | Path | None = None,
    out_csv: str | Path | None = None,
    **model_options: Any,
) -> tuple[pd.DataFrame, dict]:
    """Build the category's models (`CompBenchEvaluator.from_paths(**model_options)`), score the
    samples, write the results; returns (per-image table, summary)."""
    evaluator = CompBenchEvaluator.from_paths(category, **model_options)
    per_image, summary = evaluator.evaluate(samples_dir, category)
    write_results(per_image, summary, out_json, out_csv)
    return per_image, summary
