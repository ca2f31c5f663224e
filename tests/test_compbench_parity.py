"""T2I-CompBench parity: fed the model outputs the official scripts would see (VQA answers, detector
boxes, CLIP features), our evaluator gives the official numbers.

The `official_*` functions restate the formulas of Karine-Huang/T2I-CompBench (commit 1b70949; file
and lines in docs/compbench.md) from a reading of its scripts, independently of our code. Prompt
parsing (spaCy there, rules here) is a documented deviation and not tested here: both sides get
the same phrases, objects and numbers. Prompts come from the shipped evaluation splits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from builders_real import tiny_clip

from margrpo.evaluation.compbench import CompBenchEvaluator, compbench_locality
from margrpo.prompts.analysis import noun_phrases, parse_counts, parse_relation
from margrpo.prompts.files import COMPBENCH_DIR, read_prompt_file
from margrpo.rewards.real.clip import ClipScoreReward
from margrpo.rewards.real.detection import Detections, nms


def prompts(category: str) -> list[str]:
    return [r.prompt for r in read_prompt_file(COMPBENCH_DIR / f"{category}_val.txt", category)]


# ============================================================================ the official formulas, restated


def official_blip(answers: list[float], np_num: int = 8) -> float:
    """BLIP_vqa.py: an answer is stored as text with 4 decimals; np_num question slots (an empty one counts
    1) are multiplied in a float32 tensor; the product is stored with 4 decimals."""
    slots = np.ones(np_num, dtype=np.float32)
    for k, answer in enumerate(answers[:np_num]):
        slots[k] = float(f"{answer:.4f}")
    product = slots[0]
    for value in slots[1:]:
        product = np.float32(product * value)
    return float(f"{product:.4f}")


def official_position(locality, box1, box2, iou_threshold=0.1, distance_threshold=150) -> float:
    """2D_spatial_eval.py determine_position, pixel boxes (x_min, y_min, x_max, y_max)."""
    dx = (box2[0] + box2[2]) / 2 - (box1[0] + box1[2]) / 2
    dy = (box2[1] + box2[3]) / 2 - (box1[1] + box1[3]) / 2
    overlap = max(0, min(box1[2], box2[2]) - max(box1[0], box2[0])) * max(
        0, min(box1[3], box2[3]) - max(box1[1], box2[1])
    )
    area1, area2 = (box1[2] - box1[0]) * (box1[3] - box1[1]), (box2[2] - box2[0]) * (box2[3] - box2[1])
    iou = overlap / (area1 + area2 - overlap)
    if locality in ("next to", "on side of", "near"):
        return 1.0 if min(abs(dx), abs(dy)) < distance_threshold else distance_threshold / max(abs(dx), abs(dy))
    holds = {
        "on the right of": dx < 0 and abs(dx) > abs(dy),
        "on the left of": dx > 0 and abs(dx) > abs(dy),
        "on the bottom of": dy < 0 and abs(dy) > abs(dx),
        "on the top of": dy > 0 and abs(dy) > abs(dx),
    }
    if not holds.get(locality, False):  # any other locality ("on top of", none found) has no rule: 0
        return 0.0
    return 1.0 if iou < iou_threshold else iou_threshold / iou


def official_spatial(prompt: str, obj1: str, obj2: str, detections: list[tuple[str, float, tuple]]) -> float:
    """2D_spatial_eval.py: `detections` = UniDet's (label, confidence, pixel box), most confident first."""
    vocab = [
        "on side of",
        "next to",
        "near",
        "on the left of",
        "on the right of",
        "on the bottom of",
        "on the top of",
        "on top of",
    ]
    locality = next((w for w in vocab if w in prompt), None)
    first = {}
    for label, conf, box in detections:
        first.setdefault(label, (conf, box))
    if obj1 in first and obj2 in first:
        score = (
            0.25 * first[obj1][0]
            + 0.25 * first[obj2][0]
            + official_position(locality, first[obj1][1], first[obj2][1]) / 2
        )
    elif obj1 in first or obj2 in first:
        score = 0.25 * first[obj1 if obj1 in first else obj2][0]
    else:
        score = 0
    return 0 if score < 0.5 else score


def official_same_object(b1, b2) -> bool:
    """numeracy_eval.py calculate_iou: +1 pixel extents; IoU > 0.9 or either box 90% inside the other."""
    w = max(0, min(b1[2], b2[2]) - max(b1[0], b2[0]) + 1)
    h = max(0, min(b1[3], b2[3]) - max(b1[1], b2[1]) + 1)
    a1, a2 = (b1[2] - b1[0] + 1) * (b1[3] - b1[1] + 1), (b2[2] - b2[0] + 1) * (b2[3] - b2[1] + 1)
    return w * h / (a1 + a2 - w * h) > 0.9 or w * h / a1 > 0.9 or w * h / a2 > 0.9


def official_numeracy(asked: list[tuple[str, int]], detections: list[tuple[str, float, tuple]]) -> float:
    """numeracy_eval.py: merge same-label duplicates in detection order, then 0.5 / len(asked) for each asked
    object present and another 0.5 / len(asked) if its count is the asked number."""
    kept: list[tuple[str, tuple]] = []
    for label, _, box in detections:
        if not any(label == k and official_same_object(box, b) for k, b in kept):
            kept.append((label, box))
    labels = [k for k, _ in kept]
    weight, score = 1.0 / len(asked), 0
    for name, number in asked:
        if name in labels:
            score += 0.5 * weight
            if labels.count(name) == number:
                score += 0.5 * weight
    return score


def official_three_in_one(prompt: str, attribute: float, spatial: float, action: float) -> float:
    """3_in_1.py: the prompt's first sentence, lower-cased, looked up in the complex sub-splits."""

    def keys(name):
        return [line.strip("\n").split(".")[0].lower() for line in open(COMPBENCH_DIR / name)]

    key = prompt.split(".")[0].lower()
    if key in keys("complex_val_spatial.txt"):
        return (spatial + attribute) * 0.5
    if key in keys("complex_val_action.txt"):
        return (action + attribute) * 0.5
    return (attribute + spatial + action) / 3


# ============================================================================ fixed model outputs


class FixedVQA:
    """P(yes) per (prompt, phrase), drawn once; records the questions it was asked."""

    def __init__(self, seed=0):
        self.rng, self.answers = np.random.default_rng(seed), {}

    def answer(self, prompt, phrase):
        return self.answers.setdefault((prompt, phrase), np.float32(self.rng.uniform(0.0, 1.0)))

    def __call__(self, images, prompts, metadata):
        return torch.tensor(
            [self.answer(p, m["attr_nouns"][0]) for p, m in zip(prompts, metadata)], dtype=torch.float32
        )


class FixedDetector:
    """Per image, {name: Detections} built from UniDet-style pixel detections of one frame."""

    nms_iou = 0.5

    def __init__(self, per_image: list[list[tuple[str, float, tuple]]], frame: tuple[int, int]):
        height, width = frame
        self.tables = []
        for detections in per_image:
            table = {}
            for label in dict.fromkeys(d[0] for d in detections):
                rows = [(c, b) for lab, c, b in detections if lab == label]
                boxes = torch.tensor(
                    [[b[0] / width, b[1] / height, b[2] / width, b[3] / height] for _, b in rows], dtype=torch.float64
                )
                table[label] = Detections(boxes, torch.tensor([c for c, _ in rows], dtype=torch.float64))
            self.tables.append(table)

    def detect(self, images, names):
        return [{n: table.get(n, Detections()) for n in wanted} for table, wanted in zip(self.tables, names)]


def unidet_output(rng, names: list[str], frame: tuple[int, int], per_name=(0, 4)) -> list[tuple[str, float, tuple]]:
    """Random UniDet-like detections: confidences >= 0.5, class-wise NMS at 0.5 done, most confident first;
    some boxes nested in others (the script's duplicate rule) and some near the frame's scale of 150 px."""
    height, width = frame
    out = []
    for name in [*names, "chair"]:  # a label no prompt asks for
        boxes, scores = [], []
        for _ in range(rng.integers(*per_name, endpoint=True)):
            x0, y0 = rng.uniform(0, width * 0.8), rng.uniform(0, height * 0.8)
            box = [x0, y0, rng.uniform(x0 + 5, width), rng.uniform(y0 + 5, height)]
            boxes.append(box)
            if rng.random() < 0.3:  # a part inside the object
                boxes.append(
                    [box[0] + 1, box[1] + 1, box[0] + 0.97 * (box[2] - box[0]), box[1] + 0.97 * (box[3] - box[1])]
                )
            scores += [rng.uniform(0.5, 1.0) for _ in range(len(boxes) - len(scores))]
        if boxes:
            b, s = torch.tensor(boxes, dtype=torch.float64), torch.tensor(scores, dtype=torch.float64)
            out += [(name, float(s[i]), tuple(b[i].tolist())) for i in nms(b, s, 0.5).tolist()]
    return sorted(out, key=lambda d: -d[1])


# ============================================================================ parity per category


@pytest.mark.parametrize("category", ["color", "shape", "texture"])
def test_attribute_binding_matches_blip_vqa(category):
    texts = prompts(category)
    vqa = FixedVQA(seed=1)
    ev = CompBenchEvaluator(vqa=vqa)
    ours = ev.score(category, torch.zeros(len(texts), 3, 8, 8), texts)["score"]
    official = [official_blip([vqa.answer(p, q) for q in noun_phrases(p)]) for p in texts]
    assert ours == official  # exact: the same 4-decimal rounding and float32 product
    assert sum(ours) / len(ours) == pytest.approx(np.mean(official), abs=1e-12)


def test_blip_questions_are_the_noun_phrases():
    """The questions: one per noun phrase, "{phrase}?", at most 8 (spaCy's chunks on these prompts)."""
    asked = []
    ev = CompBenchEvaluator(
        vqa=lambda images, texts, meta: asked.extend(m["attr_nouns"][0] for m in meta) or torch.ones(len(texts))
    )
    ev.attribute(
        torch.zeros(2, 3, 8, 8),
        ["a green bench and a blue bowl", "a bathroom with green tile and a red shower curtain"],
    )
    assert asked == ["a green bench", "a blue bowl", "a bathroom", "green tile", "a red shower curtain"]


@pytest.mark.parametrize("size", [(512, 512), (1024, 1024), (512, 768)])
def test_spatial_matches_unidet_rule(size):
    frame = {(512, 512): (479, 479), (1024, 1024): (479, 479), (512, 768): (320, 480)}[size]
    rng = np.random.default_rng(2)
    texts = prompts("spatial") + [p for p in prompts("complex") if compbench_locality(p)]
    relations = [parse_relation(p) for p in texts]
    texts, relations = zip(*[(p, r) for p, r in zip(texts, relations) if r is not None])
    per_image = [unidet_output(rng, [r.obj1, r.obj2], frame, per_name=(0, 2)) for r in relations]
    ev = CompBenchEvaluator(detector=FixedDetector(per_image, frame))
    ours, parsed = ev.spatial(torch.zeros(1, 3, *size).expand(len(texts), -1, -1, -1), list(texts))
    official = [official_spatial(p, r.obj1, r.obj2, d) for p, r, d in zip(texts, relations, per_image)]
    assert all(parsed) and len(texts) > 330
    np.testing.assert_allclose(ours.numpy(), official, rtol=0, atol=1e-9)
    assert sum(s > 0 for s in official) > 50  # the rule's branches are exercised, not only zeros
    assert {compbench_locality(p) for p in texts} >= {
        "on side of",
        "next to",
        "near",
        "on the left of",
        "on the right of",
        "on the bottom of",
        "on the top of",
        "on top of",
    }


@pytest.mark.parametrize("size", [(512, 512), (512, 768)])
def test_numeracy_matches_unidet_count_rule(size):
    frame = {(512, 512): (479, 479), (512, 768): (320, 480)}[size]
    rng = np.random.default_rng(3)
    texts = prompts("numeracy")
    asked = [parse_counts(p) for p in texts]
    per_image = [unidet_output(rng, list(dict.fromkeys(n for n, _ in a)), frame) for a in asked]
    ev = CompBenchEvaluator(detector=FixedDetector(per_image, frame))
    ours, parsed = ev.numeracy(torch.zeros(1, 3, *size).expand(len(texts), -1, -1, -1), texts)
    official = [official_numeracy(a, d) for a, d in zip(asked, per_image)]
    assert all(parsed)
    np.testing.assert_allclose(ours.numpy(), official, rtol=0, atol=1e-12)
    assert {0.0, 0.5, 1.0} <= set(np.round(official, 6))


def test_non_spatial_is_the_clip_cosine(tmp_path):
    """CLIP_similarity.py: cosine of the L2-normalised image and text features, not scaled or clipped."""
    from PIL import Image
    from transformers import CLIPModel, CLIPProcessor

    path = tiny_clip(tmp_path / "clip")
    texts = prompts("non_spatial")[:6]
    images = torch.rand(len(texts), 3, 32, 32, generator=torch.Generator().manual_seed(0))
    ours = CompBenchEvaluator(clip=ClipScoreReward(str(path))).score("non_spatial", images, texts)["score"]
    model, processor = CLIPModel.from_pretrained(path).eval(), CLIPProcessor.from_pretrained(path)
    pil = [
        Image.fromarray((im * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()) for im in images
    ]  # as a saved PNG
    with torch.no_grad():
        img = model.get_image_features(**processor(images=pil, return_tensors="pt"))
        txt = model.get_text_features(**processor.tokenizer(texts, padding=True, return_tensors="pt"))
    official = [float(i @ t / (i.norm() * t.norm())) for i, t in zip(img, txt)]
    np.testing.assert_allclose(ours, official, atol=1e-5)
    assert min(official) < 0 or max(official) < 1  # a raw cosine, not 100 * max(cos, 0)


def test_complex_matches_three_in_one():
    texts = prompts("complex")
    rng = np.random.default_rng(4)
    parts = {p: rng.uniform(0, 1, size=3) for p in texts}
    spatial, action = (
        [r.prompt for r in read_prompt_file(COMPBENCH_DIR / f"complex_val_{k}.txt", "complex")]
        for k in ("spatial", "action")
    )
    ev = CompBenchEvaluator(complex_spatial=spatial, complex_action=action)
    ev.attribute = lambda images, ps: torch.tensor([parts[p][0] for p in ps], dtype=torch.float64)
    ev.spatial = lambda images, ps: (torch.tensor([parts[p][1] for p in ps], dtype=torch.float64), [True] * len(ps))
    ev.non_spatial = lambda images, ps: torch.tensor([parts[p][2] for p in ps], dtype=torch.float64)
    out = ev.score("complex", torch.zeros(len(texts), 3, 8, 8), texts)
    assert out["score"] == [official_three_in_one(p, *parts[p]) for p in texts]
    assert {"spatial", "action", "all"} == set(out["complex_kind"])
