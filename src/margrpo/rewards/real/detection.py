"""Detection rewards: box geometry, T2I-R1's relation / count / presence scores, Grounding DINO.

The geometry and scores are plain torch on boxes (T2I-CompBench's evaluator reuses them); only
`GroundingDinoReward` loads a model, and imports transformers in its constructor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from margrpo.prompts.analysis import RELATIONS, DetectionTask, Relation, detection_task
from margrpo.rewards.real._common import (
    _check_batch,
    _check_batch_size,
    _chunks,
    _dtype,
    _model_and_processor,
    _prepare_transformers,
    _to_pil,
)
from margrpo.rewards.registry import register_reward

# ============================================================================ box geometry


def box_iou(a: Tensor, b: Tensor) -> Tensor:
    """IoU of xyxy boxes a [N, 4] and b [M, 4] -> [N, M]."""
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)  # [N]
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)  # [M]
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])  # [N, M, 2]
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])  # [N, M, 2]
    inter = (rb - lt).clamp(min=0).prod(-1)  # [N, M]
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(inter))


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Greedy non-maximum suppression (as torchvision.ops.nms): indices kept, by decreasing score."""
    order = torch.argsort(scores, descending=True, stable=True)
    keep: list[int] = []
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    iou = box_iou(boxes[order], boxes[order]) if len(order) else torch.zeros(0, 0)
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(int(order[i]))
        suppressed |= iou[i] > iou_threshold
    return torch.tensor(keep, dtype=torch.long)


def relation_score(
    relation: str,
    box1: Sequence[float],
    box2: Sequence[float],
    iou_threshold: float = 0.1,
    near_threshold: float = 0.3,
) -> float:
    """Soft score in [0, 1] that xyxy box1 (obj1) stands in `relation` to box2 (obj2).

    The rule of T2I-CompBench's `determine_position` (also T2I-R1's), image y pointing down,
    dx = centre2.x - centre1.x, dy = centre2.y - centre1.y:
    - left: dx > 0 and |dx| > |dy|; right: dx < 0 and |dx| > |dy|;
      above: dy > 0 and |dy| > |dx|; below: dy < 0 and |dy| > |dx|;
      each scores 1 if IoU < iou_threshold, else iou_threshold / IoU, and 0 if the direction is wrong;
    - near: 1 if |dx| < near_threshold or |dy| < near_threshold, else near_threshold / max(|dx|, |dy|).
    Coordinates are whatever the boxes use: Grounding DINO's are normalised to [0, 1], where the
    default near_threshold 0.3 is T2I-CompBench's 150 px on a 512-px image.
    """
    if relation not in RELATIONS:
        raise ValueError(f"Unknown relation: {relation!r}; expected one of {RELATIONS}")
    (x0, y0, x1, y1), (u0, v0, u1, v1) = [float(v) for v in box1], [float(v) for v in box2]
    dx = (u0 + u1) / 2 - (x0 + x1) / 2
    dy = (v0 + v1) / 2 - (y0 + y1) / 2
    if relation == "near":
        if abs(dx) < near_threshold or abs(dy) < near_threshold:
            return 1.0
        return near_threshold / max(abs(dx), abs(dy))
    inter = max(0.0, min(x1, u1) - max(x0, u0)) * max(0.0, min(y1, v1) - max(y0, v0))
    union = (x1 - x0) * (y1 - y0) + (u1 - u0) * (v1 - v0) - inter
    iou = inter / union if union > 0 else 0.0
    horizontal, vertical = abs(dx) > abs(dy), abs(dy) > abs(dx)
    correct = {
        "left": dx > 0 and horizontal,
        "right": dx < 0 and horizontal,
        "above": dy > 0 and vertical,
        "below": dy < 0 and vertical,
    }[relation]
    if not correct:
        return 0.0
    return 1.0 if iou < iou_threshold else iou_threshold / iou


# ============================================================================ detection scores


@dataclass
class Detections:
    """Boxes of one phrase in one image: xyxy normalised to [0, 1] [n, 4], phrase scores [n] (descending)."""

    boxes: Tensor = field(default_factory=lambda: torch.zeros(0, 4))
    scores: Tensor = field(default_factory=lambda: torch.zeros(0))

    def __len__(self) -> int:
        return int(self.scores.numel())

    def best(self) -> tuple[Tensor, float] | None:
        """(box [4], score) of the most confident detection, or None."""
        if not len(self):
            return None
        i = int(torch.argmax(self.scores))
        return self.boxes[i], float(self.scores[i])


def count_boxes(det: Detections, iou_threshold: float = 0.5) -> int:
    """Objects detected after non-maximum suppression (duplicates of one object merged)."""
    return int(nms(det.boxes, det.scores, iou_threshold).numel()) if len(det) else 0


def t2i_r1_spatial_score(
    dets: dict[str, Detections], rel: Relation, iou_threshold: float = 0.1, near_threshold: float = 0.3
) -> float:
    """T2I-R1: 0.2 per object detected; with both, + relation_score(best boxes) / 2 (max 0.9)."""
    d1, d2 = dets.get(rel.obj1, Detections()), dets.get(rel.obj2, Detections())
    score = 0.2 * (len(d1) > 0) + 0.2 * (len(d2) > 0)
    if len(d1) and len(d2):
        score += relation_score(rel.relation, d1.best()[0], d2.best()[0], iou_threshold, near_threshold) / 2
    return score


def count_match_score(
    dets: dict[str, Detections], counts: Sequence[tuple[str, int]], nms_iou: float, wrong: float
) -> float:
    """Mean over the asked (name, count) of 1 if the NMS count is right, `wrong` if detected with another
    count, 0 if absent. The shared form of T2I-R1's reward and T2I-CompBench's numeracy metric."""
    total = 0.0
    for name, expected in counts:
        det = dets.get(name, Detections())
        if len(det):
            total += 1.0 if count_boxes(det, nms_iou) == expected else wrong
    return total / len(counts)


def t2i_r1_numeracy_score(
    dets: dict[str, Detections], counts: Sequence[tuple[str, int]], nms_iou: float = 0.5
) -> float:
    """T2I-R1: mean over objects of 1 if the NMS count equals the asked number, 0.2 if wrong, 0 if absent."""
    return count_match_score(dets, counts, nms_iou, wrong=0.2) if counts else 1.0


def t2i_r1_presence_score(dets: dict[str, Detections], nouns: Sequence[str]) -> float:
    """T2I-R1: fraction of the nouns detected at least once (1 for a prompt without nouns)."""
    if not nouns:
        return 1.0
    return sum(len(dets.get(n, Detections())) > 0 for n in nouns) / len(nouns)


# ============================================================================ Grounding DINO


@register_reward("grounding_dino")
class GroundingDinoReward:
    """Open-vocabulary detection reward (T2I-R1's "gdino", used by the MAR-GRPO paper's mixed reward).

    Per prompt a DetectionTask (`detection_task`: T2I-R1 metadata or the prompt rules) names the
    objects; the text query is "name1 . name2 ." and a query box counts for a name when the mean
    sigmoid logit over the name's tokens exceeds `box_threshold` (T2I-R1's token-span scores).
    - spatial: 0.2 per object detected, + relation_score(most confident boxes) / 2 (max 0.9);
    - numeracy: mean over objects of 1 (count after NMS at `nms_iou` == asked), 0.2 (detected,
      wrong count) or 0 (absent);
    - presence (every other prompt, and spatial/numeracy prompts that cannot be parsed): fraction
      of the nouns detected; 1 for a prompt with no nouns.
    One deviation from T2I-R1's code: there "above" and "on top of" score no relation (the names
    are missing from its rule); here they are scored like "on the top of".
    `path`: a Grounding DINO folder (IDEA-Research/grounding-dino-base); `processor_path` defaults
    to `path`.
    """

    def __init__(
        self,
        path: str,
        processor_path: str | None = None,
        box_threshold: float = 0.3,
        nms_iou: float = 0.5,
        iou_threshold: float = 0.1,
        near_threshold: float = 0.3,
        device: str = "cpu",
        batch_size: int = 8,
        dtype: str = "float32",
    ):
        _prepare_transformers()
        from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

        source = "https://huggingface.co/IDEA-Research/grounding-dino-base"
        model_dir, proc_dir = _model_and_processor(path, processor_path, "grounding_dino", source)
        self.device = torch.device(device)
        self.batch_size, self.dtype = _check_batch_size(batch_size), _dtype(dtype, "grounding_dino")
        if self.dtype != torch.float32:  # transformers' Grounding DINO builds float32 tensors inside its forward
            raise ValueError(
                f"grounding_dino: dtype {dtype!r} is not supported (transformers' model mixes in float32); use float32"
            )
        self.box_threshold, self.nms_iou = float(box_threshold), float(nms_iou)
        self.iou_threshold, self.near_threshold = float(iou_threshold), float(near_threshold)
        self.model = (
            AutoModelForZeroShotObjectDetection.from_pretrained(model_dir, local_files_only=True)
            .eval()
            .to(self.device)
        )
        self.processor = AutoProcessor.from_pretrained(proc_dir, local_files_only=True)

    @staticmethod
    def query(names: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
        """Grounding DINO text "a . b ." for the names, and each name's character span in it."""
        spans, parts, pos = [], [], 0
        for name in names:
            spans.append((pos, pos + len(name)))
            parts.append(name)
            pos += len(name) + 3  # " . "
        return " . ".join(parts) + " .", spans

    @torch.no_grad()
    def detect(self, images: Tensor, names: Sequence[Sequence[str]]) -> list[dict[str, Detections]]:
        """For each image, {name: Detections} of its names (boxes above box_threshold, best first)."""
        pil = _to_pil(images)
        results: list[dict[str, Detections]] = [{} for _ in pil]
        todo = [i for i, n in enumerate(names) if n]
        for s in _chunks(len(todo), self.batch_size):
            idx = todo[s]
            queries = [self.query([n.lower() for n in names[i]]) for i in idx]
            texts = [q for q, _ in queries]
            inputs = self.processor(
                images=[pil[i] for i in idx], text=texts, padding="longest", return_tensors="pt"
            ).to(self.device)
            out = self.model(**inputs)
            probs = out.logits.float().sigmoid()  # [b, Q, max_text_len]
            boxes = out.pred_boxes.float()  # [b, Q, 4] cx, cy, w, h in [0, 1]
            xyxy = torch.cat([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], -1)
            offsets = self.processor.tokenizer(texts, return_offsets_mapping=True, padding="longest")["offset_mapping"]
            for b, i in enumerate(idx):
                for name, (start, end) in zip(names[i], queries[b][1]):
                    tokens = [t for t, (a, z) in enumerate(offsets[b]) if z > a and a >= start and z <= end]
                    tokens = [t for t in tokens if t < probs.shape[-1]]
                    if not tokens:
                        results[i][name] = Detections()
                        continue
                    phrase = probs[b][:, tokens].mean(-1)  # [Q]
                    keep = phrase > self.box_threshold
                    order = torch.argsort(phrase[keep], descending=True)
                    results[i][name] = Detections(xyxy[b][keep][order].cpu(), phrase[keep][order].cpu())
        return results

    def score_task(self, task: DetectionTask, dets: dict[str, Detections]) -> float:
        """The T2I-R1 score of one image's detections for its task."""
        if task.kind == "spatial":
            return t2i_r1_spatial_score(dets, task.relation, self.iou_threshold, self.near_threshold)
        if task.kind == "numeracy":
            return t2i_r1_numeracy_score(dets, task.counts, self.nms_iou)
        return t2i_r1_presence_score(dets, task.nouns)

    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        metadata = _check_batch(images, prompts, metadata)
        tasks = [detection_task(p, m) for p, m in zip(prompts, metadata)]
        dets = self.detect(images, [t.nouns for t in tasks])
        return torch.tensor([self.score_task(t, d) for t, d in zip(tasks, dets)], dtype=torch.float32)
