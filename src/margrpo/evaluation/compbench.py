"""T2I-CompBench evaluation of real samples, with the scorers of `margrpo.rewards.real`.

Input: a folder of `{prompt}_{index:06d}.png` (T2I-CompBench's layout; the prompt is read back
from the file name) and a category. Per category, the metric of the official scripts
(Karine-Huang/T2I-CompBench; formulas with file and line in docs/compbench.md), with Grounding
DINO standing in for its UniDet detector:

Each category, its metric, and its per-image score:

- color, shape, texture: BLIP-VQA; product over the prompt's noun phrases (at most 8) of
  P(yes | "{phrase}?"), each answer and the product kept to 4 decimals.
- spatial (2-D): detection; 0.25 conf(obj1) + 0.25 conf(obj2) + position / 2, set to 0 below 0.5; position
  from the boxes in UniDet's 479-px frame.
- numeracy: detection; mean over objects of 0.5 (detected) + 0.5 (count == asked), duplicates merged as the
  script merges them.
- non_spatial: CLIP; cosine(image, prompt).
- complex: 3-in-1; mean of the attribute (BLIP-VQA), spatial and non-spatial scores.

For complex, T2I-CompBench averages only two of the three for its "spatial" and "action"
sub-splits (attribute + spatial, attribute + non-spatial); `prompts_dir` (default: the shipped
`margrpo.prompts.files.COMPBENCH_DIR`) holds complex_val_spatial.txt and complex_val_action.txt.
Differences from the original, each a stand-in for a model we do not run: noun phrases and object
names come from the rules of `margrpo.prompts.analysis` instead of spaCy; detections are Grounding DINO
queries whose phrase score exceeds the detector's box_threshold (UniDet: class confidence >= 0.5),
reduced by NMS at nms_iou (UniDet applies its own NMS at 0.5 before the script sees its boxes);
complex's non-spatial part scores the whole prompt (T2I-CompBench drops adjectives with spaCy's
tagger). 3d_spatial needs a depth model (UniDet + DPT) and is not supported.
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
from margrpo.prompts.analysis import noun_phrases, parse_counts, parse_relation
from margrpo.prompts.files import COMPBENCH_DIR, read_prompt_file
from margrpo.rewards.real.clip import ClipScoreReward
from margrpo.rewards.real.detection import Detections, GroundingDinoReward, nms, relation_score
from margrpo.rewards.real.vqa import BlipVQAReward

__all__ = [
    "CATEGORIES",
    "METRICS",
    "CompBenchEvaluator",
    "Sample",
    "canonical_category",
    "compbench_attribute_score",
    "compbench_count",
    "compbench_locality",
    "compbench_numeracy_score",
    "compbench_spatial_score",
    "compbench_three_in_one",
    "evaluate_directory",
    "list_samples",
    "parse_sample_name",
    "unidet_frame",
    "write_results",
]

CATEGORIES = ("color", "shape", "texture", "spatial", "numeracy", "non_spatial", "complex")
METRICS = {
    "color": "blip_vqa",
    "shape": "blip_vqa",
    "texture": "blip_vqa",
    "spatial": "detection_2d",
    "numeracy": "detection_count",
    "non_spatial": "clip",
    "complex": "3_in_1",
}
_ALIASES = {
    "2d_spatial": "spatial",
    "2d-spatial": "spatial",
    "non-spatial": "non_spatial",
    "nonspatial": "non_spatial",
}
_UNSUPPORTED = {"3d_spatial": "3d_spatial needs a depth model (T2I-CompBench: UniDet + DPT); it is not supported"}
MODEL_METRICS = {
    "vqa": ("blip_vqa", "3_in_1"),
    "detector": ("detection_2d", "detection_count", "3_in_1"),
    "clip": ("clip", "3_in_1"),
}  # which metrics each model serves
COMPLEX_SPLITS = {"spatial": "complex_val_spatial.txt", "action": "complex_val_action.txt"}

# The official scripts' constants (Karine-Huang/T2I-CompBench; docs/compbench.md has the lines)
MAX_PHRASES = 8  # BLIP_vqa.py: --np_num, the questions asked per image
UNIDET_SIZE, UNIDET_MAX_SIZE = (
    479,
    480,
)  # model_bank.py: Resize(479, max_size=480) before UniDet; boxes are in that frame
NEAR_PX, OVERLAP_IOU = 150, 0.1  # 2D_spatial_eval.py determine_position: distance_threshold, iou_threshold
# 2D_spatial_eval.py: the first of these phrases found in the prompt (substring, in this order) picks the rule of
# determine_position; "on top of" is searched for but has no rule there, so its position scores 0 (kept, for parity).
SPATIAL_VOCAB = {
    "on side of": "near",
    "next to": "near",
    "near": "near",
    "on the left of": "left",
    "on the right of": "right",
    "on the bottom of": "below",
    "on the top of": "above",
    "on top of": None,
}


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


# ============================================================================ the official scores from model outputs


def compbench_attribute_score(answers: Sequence[float]) -> float:
    """BLIP-VQA score of one image from its P(yes) answers: each answer kept to 4 decimals, their product
    in float32 (no question: 1), kept to 4 decimals, as BLIP_vqa.py stores them."""
    product = np.float32(1.0)
    for answer in answers:
        product = np.float32(product * np.float32(round(float(answer), 4)))
    return round(float(product), 4)


def unidet_frame(height: int, width: int) -> tuple[int, int]:
    """(height, width) of the image UniDet sees: torchvision's Resize(479, max_size=480) of a height x width image."""
    short, long = sorted((height, width))
    new_short, new_long = UNIDET_SIZE, int(UNIDET_SIZE * long / short)
    if new_long > UNIDET_MAX_SIZE:
        new_short, new_long = int(UNIDET_MAX_SIZE * new_short / new_long), UNIDET_MAX_SIZE
    return (new_long, new_short) if height > width else (new_short, new_long)


def _to_frame(boxes: Tensor, frame: tuple[int, int]) -> Tensor:
    """Normalised xyxy boxes [n, 4] -> pixels of a (height, width) frame."""
    height, width = frame
    return boxes * torch.tensor([width, height, width, height], dtype=boxes.dtype)


def compbench_locality(prompt: str) -> str | None:
    """The locality phrase 2D_spatial_eval.py finds: the first of SPATIAL_VOCAB that occurs in the prompt."""
    return next((phrase for phrase in SPATIAL_VOCAB if phrase in prompt), None)


def compbench_spatial_score(
    dets: dict[str, Detections],
    obj1: str,
    obj2: str,
    locality: str | None,
    frame: tuple[int, int] = (UNIDET_SIZE, UNIDET_SIZE),
) -> float:
    """T2I-CompBench's 2-D spatial score of one image.

    Both objects found: 0.25 * conf1 + 0.25 * conf2 + position / 2, where position is the soft rule
    of `locality` (`relation_score` on the most confident boxes in pixels of UniDet's `frame`, 150 px
    for "near", IoU threshold 0.1; 0 for a locality without a rule); one found: 0.25 * its confidence;
    none: 0. A score below 0.5 is set to 0.
    """
    best1 = dets.get(obj1, Detections()).best()
    best2 = dets.get(obj2, Detections()).best()
    if best1 and best2:
        relation = SPATIAL_VOCAB.get(locality) if locality else None
        position = 0.0
        if relation is not None:
            box1, box2 = (_to_frame(b[None], frame)[0] for b in (best1[0], best2[0]))
            position = relation_score(relation, box1, box2, OVERLAP_IOU, NEAR_PX)
        score = 0.25 * best1[1] + 0.25 * best2[1] + position / 2
    elif best1 or best2:
        score = 0.25 * (best1 or best2)[1]
    else:
        score = 0.0
    return score if score >= 0.5 else 0.0


def _duplicates(a: Sequence[float], b: Sequence[float]) -> bool:
    """numeracy_eval.py's test of two pixel boxes (inclusive pixel extents): IoU > 0.9, or over 0.9 of either
    inside the other."""
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0]) + 1) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]) + 1)
    area_a, area_b = (a[2] - a[0] + 1) * (a[3] - a[1] + 1), (b[2] - b[0] + 1) * (b[3] - b[1] + 1)
    return inter / (area_a + area_b - inter) > 0.9 or inter / area_a > 0.9 or inter / area_b > 0.9


def compbench_count(det: Detections, frame: tuple[int, int] = (UNIDET_SIZE, UNIDET_SIZE), nms_iou: float = 0.5) -> int:
    """Objects counted as numeracy_eval.py counts a label's boxes, after NMS at `nms_iou` (UniDet's own):
    in order of confidence, a box that duplicates one already kept (`_duplicates`, in `frame` pixels) is dropped."""
    if not len(det):
        return 0
    kept: list[list[float]] = []
    for box in _to_frame(det.boxes[nms(det.boxes, det.scores, nms_iou)], frame).tolist():
        if not any(_duplicates(box, k) for k in kept):
            kept.append(box)
    return len(kept)


def compbench_numeracy_score(
    dets: dict[str, Detections],
    counts: Sequence[tuple[str, int]],
    frame: tuple[int, int] = (UNIDET_SIZE, UNIDET_SIZE),
    nms_iou: float = 0.5,
) -> float:
    """T2I-CompBench's numeracy score: mean over the asked (object, number) of 0.5 if detected, plus 0.5 if
    `compbench_count` equals the number; 0 for a prompt without counts (the script would divide by zero)."""
    if not counts:
        return 0.0
    total = 0.0
    for name, number in counts:
        det = dets.get(name, Detections())
        if len(det):
            total += 0.5 + 0.5 * (compbench_count(det, frame, nms_iou) == number)
    return total / len(counts)


def compbench_three_in_one(kind: str, attribute: float, spatial: float, action: float) -> float:
    """3_in_1.py: (attribute + spatial) / 2 for the "spatial" sub-split, (attribute + non-spatial) / 2 for
    "action", the mean of all three otherwise (kind "all")."""
    if kind == "spatial":
        return (spatial + attribute) * 0.5
    if kind == "action":
        return (action + attribute) * 0.5
    return (attribute + spatial + action) / 3


# ============================================================================ evaluator


class CompBenchEvaluator:
    """T2I-CompBench scores of images: one method per metric, built from the `margrpo.rewards.real` scorers.

    `vqa` (BlipVQAReward, asked one phrase per row), `detector` (GroundingDinoReward) and `clip`
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
        """Build only the models `category` (one or several) needs from local folders (see `margrpo.rewards.real`).

        `*_options`: further keyword options of BlipVQAReward / GroundingDinoReward / ClipScoreReward
        (e.g. processor_path, box_threshold).
        """
        categories = [category] if isinstance(category, str) else list(category)
        need = needed_models(categories)
        for kind, path, what in (
            ("vqa", vqa_path, "vqa_path (BLIP-VQA)"),
            ("detector", detector_path, "detector_path (Grounding DINO)"),
            ("clip", clip_path, "clip_path (CLIP)"),
        ):
            if kind in need and path is None:
                raise ValueError(f"category {need[kind]!r} needs {what}")
        common = {"device": device, "batch_size": batch_size}
        vqa = BlipVQAReward(vqa_path, reduce="product", **common, **(vqa_options or {})) if "vqa" in need else None
        det = GroundingDinoReward(detector_path, **common, **(detector_options or {})) if "detector" in need else None
        clip = ClipScoreReward(clip_path, form="cosine", **common, **(clip_options or {})) if "clip" in need else None
        spatial, action = (), ()
        if "complex" in map(canonical_category, categories):
            folder = Path(prompts_dir or COMPBENCH_DIR)
            spatial, action = (
                [r.prompt for r in read_prompt_file(folder / COMPLEX_SPLITS[kind], "complex")]
                for kind in ("spatial", "action")
            )
        return cls(vqa, det, clip, spatial, action, batch_size)

    # ------------------------------------------------------------------ per metric

    def _need(self, model: Any, what: str, category: str) -> Any:
        if model is None:
            raise ValueError(f"category {category!r} needs a {what}; pass it to CompBenchEvaluator")
        return model

    def attribute(self, images: Tensor, prompts: list[str]) -> Tensor:
        """BLIP-VQA: `compbench_attribute_score` of the answers to "{phrase}?" for each noun phrase. [B]"""
        vqa = self._need(self.vqa, "BLIP-VQA scorer (vqa=)", "attribute")
        phrases = [noun_phrases(p, MAX_PHRASES) for p in prompts]
        owners = [i for i, ps in enumerate(phrases) for _ in ps]
        answers = torch.zeros(0)
        if owners:  # one row per (image, phrase): a phrase given as `attr_nouns` is the one question asked
            answers = vqa(
                images[owners], [prompts[i] for i in owners], [{"attr_nouns": [p]} for ps in phrases for p in ps]
            )
        per_image = [[float(a) for a, o in zip(answers, owners) if o == i] for i in range(len(prompts))]
        return torch.tensor([compbench_attribute_score(a) for a in per_image], dtype=torch.float64)

    def non_spatial(self, images: Tensor, prompts: list[str]) -> Tensor:
        """CLIP cosine(image, prompt). [B]"""
        return self._need(self.clip, "CLIP scorer (clip=)", "non_spatial")(images, prompts, [{} for _ in prompts])

    def spatial(self, images: Tensor, prompts: list[str]) -> tuple[Tensor, list[bool]]:
        """Detection 2-D spatial scores [B], and whether each prompt's two objects were parsed."""
        det = self._need(self.detector, "Grounding DINO detector (detector=)", "spatial")
        relations = [parse_relation(p) for p in prompts]  # the objects; the rule comes from compbench_locality
        found = det.detect(images, [[r.obj1, r.obj2] if r else [] for r in relations])
        frame = unidet_frame(*images.shape[-2:])
        scores = [
            compbench_spatial_score(d, r.obj1, r.obj2, compbench_locality(p), frame) if r else 0.0
            for p, r, d in zip(prompts, relations, found)
        ]
        return torch.tensor(scores, dtype=torch.float64), [r is not None for r in relations]

    def numeracy(self, images: Tensor, prompts: list[str]) -> tuple[Tensor, list[bool]]:
        """Detection count scores [B], and whether each prompt's counts were parsed."""
        det = self._need(self.detector, "Grounding DINO detector (detector=)", "numeracy")
        counts = [parse_counts(p) for p in prompts]
        found = det.detect(images, [list(dict.fromkeys(n for n, _ in c)) for c in counts])
        frame = unidet_frame(*images.shape[-2:])
        scores = [compbench_numeracy_score(d, c, frame, det.nms_iou) for c, d in zip(counts, found)]
        return torch.tensor(scores, dtype=torch.float64), [bool(c) for c in counts]

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
        total = [
            compbench_three_in_one(k, a, s, n)
            for k, a, s, n in zip(kinds, attr.tolist(), spat.tolist(), action.tolist())
        ]
        return {
            "score": total,
            "attribute": attr.tolist(),
            "spatial": spat.tolist(),
            "non_spatial": action.tolist(),
            "complex_kind": kinds,
            "parsed": parsed,
        }

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
                rows.append(
                    {
                        "file": s.path.name,
                        "prompt": s.prompt,
                        "index": s.index,
                        "category": category,
                        **{k: v[i] for k, v in result.items()},
                    }
                )
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
    from margrpo.infra.files import atomic_write_csv, atomic_write_json

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
