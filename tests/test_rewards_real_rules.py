"""The rules the real reward scorers (margrpo.rewards.real) apply, without a model: prompt parsing (noun phrases,
relations, counts, detection tasks, VQA phrases), box geometry and T2I-R1's detection scores."""

import pytest
import torch
from builders_real import dets

from margrpo.prompts.analysis import (
    DetectionTask,
    Relation,
    detection_task,
    noun_phrases,
    object_name,
    parse_counts,
    parse_relation,
    singular,
    vqa_phrases,
)
from margrpo.rewards.real.detection import (
    Detections,
    box_iou,
    count_boxes,
    nms,
    relation_score,
    t2i_r1_numeracy_score,
    t2i_r1_presence_score,
    t2i_r1_spatial_score,
)

# ============================================================================ prompt rules


@pytest.mark.parametrize(
    "prompt, phrases",
    [
        ("a green bench and a blue bowl", ["a green bench", "a blue bowl"]),
        ("rubber sole shoes and fluffy clouds", ["rubber sole shoes", "fluffy clouds"]),
        ("The red apple was next to the oval plate.", ["The red apple", "the oval plate"]),
        (
            "The striped black and white cat lay next to the soft grey blanket.",
            ["The striped black and white cat", "the soft grey blanket"],
        ),
        (
            "The fresh omelet cooked the fluffy eggs and the crisp vegetables.",
            ["The fresh omelet", "the fluffy eggs", "the crisp vegetables"],
        ),
        (
            "A woman is speaking on the phone and making plans with a friend.",
            ["A woman", "the phone", "plans", "a friend"],
        ),
        ("a photo of a purple elephant and a blue teddy bear", ["a purple elephant", "a blue teddy bear"]),
        (
            "A long, narrow black kitchen with yellow and white floor tiles.",
            ["A long, narrow black kitchen", "yellow and white floor tiles"],
        ),
        ("a mouse on the bottom of a painting", ["a mouse", "a painting"]),
        ("The red hat was on top of the brown coat rack.", ["The red hat", "the brown coat rack"]),
    ],
)
def test_noun_phrases(prompt, phrases):
    assert noun_phrases(prompt) == phrases


def test_object_name_and_singular():
    assert object_name("The red hat") == "red hat"
    assert object_name("four shrimp") == "shrimp"
    cases = {
        "cats": "cat",
        "strawberries": "strawberry",
        "people": "person",
        "mice": "mouse",
        "boxes": "box",
        "benches": "bench",
        "glasses": "glasses",
        "horses": "horse",
        "ice creams": "ice cream",
        "bus": "bus",
        "sheep": "sheep",
        "knives": "knife",
        "cactus": "cactus",
    }
    assert {w: singular(w) for w in cases} == cases


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("a bee on the right of a refrigerator", Relation("bee", "right", "refrigerator")),
        ("a giraffe next to a lamp", Relation("giraffe", "near", "lamp")),
        ("a girl on the top of a frog", Relation("girl", "above", "frog")),
        ("a photo of a car below a zebra", Relation("car", "below", "zebra")),
        ("a photo of a backpack left of a sports ball", Relation("backpack", "left", "sports ball")),
        ("The red hat was on top of the brown coat rack.", Relation("red hat", "above", "brown coat rack")),
        ("a mouse on side of a key", Relation("mouse", "near", "key")),
        ("a red cup and a blue orange", None),
        ("on the left of a dog", None),
    ],
)
def test_parse_relation(prompt, expected):
    assert parse_relation(prompt) == expected


@pytest.mark.parametrize(
    "prompt, expected",
    [
        ("two dogs", [("dog", 2)]),
        ("a photo of four coasters", [("coaster", 4)]),
        ("four tents, two boats and one pig", [("tent", 4), ("boat", 2), ("pig", 1)]),
        ("eight cats lounged in the sun", [("cat", 8)]),
        ("four trains carried four people", [("train", 4), ("person", 4)]),
        ("two balloons floated with four mice", [("balloon", 2), ("mouse", 4)]),
        ("three ice creams and a cat", [("ice cream", 3), ("cat", 1)]),
        ("one traffic light and two cars", [("traffic light", 1), ("car", 2)]),
        ("four dogs in a park", [("dog", 4)]),
        ("a dog and a cat", []),
        ("3 apples", [("apple", 3)]),
    ],
)
def test_parse_counts(prompt, expected):
    assert parse_counts(prompt) == expected


def test_detection_task_from_metadata_and_rules():
    meta = {
        "task_type": "spatial",
        "nouns": ["car", "zebra"],
        "spatial_info": {"obj1": "car", "obj2": "zebra", "locality": "below"},
    }
    assert detection_task("a photo of a car below a zebra", meta) == DetectionTask(
        "spatial", ("car", "zebra"), relation=Relation("car", "below", "zebra")
    )
    meta = {
        "task_type": "numeracy",
        "nouns": ["helmet", "pen"],
        "numeracy_info": [{"obj_name": "helmet", "num": 1}, {"obj_name": "pen", "num": 3}],
    }
    assert detection_task("one helmet and three pens", meta) == DetectionTask(
        "numeracy", ("helmet", "pen"), counts=(("helmet", 1), ("pen", 3))
    )
    assert detection_task(
        "a photo of a bottle and a teddy bear", {"task_type": "object", "nouns": ["bottle", "teddy bear"]}
    ) == DetectionTask("presence", ("bottle", "teddy bear"))
    # no metadata: inferred from the prompt
    assert detection_task("two cats").kind == "numeracy"
    assert detection_task("a dog on the left of a bench").relation == Relation("dog", "left", "bench")
    assert detection_task("a red bench and a blue bowl") == DetectionTask("presence", ("red bench", "blue bowl"))
    # a spatial task whose relation is not 2-D (or unparseable) falls back to presence of its nouns
    meta = {
        "task_type": "spatial",
        "nouns": ["dog", "desk"],
        "spatial_info": {"obj1": "dog", "obj2": "desk", "locality": "in front of"},
    }
    assert detection_task("a dog in front of a desk", meta) == DetectionTask("presence", ("dog", "desk"))
    assert detection_task("a strange scene", {"category": "spatial"}).kind == "presence"


def test_vqa_phrases():
    assert vqa_phrases("a photo of a red bench", {"attr_nouns": ["red bench"], "nouns": ["bench"]}) == ["red bench"]
    assert vqa_phrases("a photo of a bench", {"attr_nouns": None, "nouns": ["bench"]}) == ["bench"]
    assert vqa_phrases("a red bench and a blue bowl", {}, max_phrases=1) == ["a red bench"]


# ============================================================================ geometry and detection scores


def test_relation_score_hand_computed():
    left, right = [0.0, 0.4, 0.2, 0.6], [0.6, 0.4, 0.8, 0.6]  # centres (0.1, 0.5), (0.7, 0.5): dx = 0.6
    assert relation_score("left", left, right) == 1.0
    assert relation_score("right", left, right) == 0.0
    assert relation_score("right", right, left) == 1.0
    assert relation_score("above", left, right) == 0.0  # |dy| = 0 < |dx|
    top, bottom = [0.4, 0.0, 0.6, 0.2], [0.4, 0.7, 0.6, 0.9]
    assert relation_score("above", top, bottom) == 1.0 and relation_score("below", bottom, top) == 1.0
    assert relation_score("below", top, bottom) == 0.0
    # overlapping: IoU = 0.5 * 0.5 / (1 + 1 - 0.25)... boxes [0, 0, 1, 1] and [0.5, 0, 1.5, 1]: IoU = 0.5 / 1.5 = 1/3
    assert relation_score("left", [0, 0, 1, 1], [0.5, 0, 1.5, 1]) == pytest.approx(0.1 / (1 / 3))
    # near: |dy| = 0 < 0.3 -> 1; far in both directions -> 0.3 / max(|dx|, |dy|)
    assert relation_score("near", left, right) == 1.0
    assert relation_score("near", [0, 0, 0.1, 0.1], [0.8, 0.5, 0.9, 0.6]) == pytest.approx(0.3 / 0.8)
    with pytest.raises(ValueError, match="Unknown relation"):
        relation_score("behind", left, right)


def test_nms_and_counting():
    boxes = torch.tensor([[0, 0, 1, 1], [0.05, 0, 1.05, 1], [2, 2, 3, 3], [0, 0, 1, 1.2]], dtype=torch.float32)
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95])
    assert nms(boxes, scores, 0.5).tolist() == [3, 2]
    assert count_boxes(Detections(boxes, scores), 0.5) == 2
    assert count_boxes(Detections(), 0.5) == 0
    torch.testing.assert_close(box_iou(boxes[:1], boxes[2:3]), torch.zeros(1, 1))


def test_t2i_r1_scores_hand_computed():
    rel = Relation("dog", "left", "bench")
    dog, bench = dets(([0.0, 0.4, 0.2, 0.6], 0.9)), dets(([0.6, 0.4, 0.8, 0.6], 0.5))
    assert t2i_r1_spatial_score({"dog": dog, "bench": bench}, rel) == pytest.approx(0.9)  # 0.2 + 0.2 + 1 / 2
    assert t2i_r1_spatial_score({"dog": bench, "bench": dog}, rel) == pytest.approx(0.4)  # wrong side
    assert t2i_r1_spatial_score({"dog": dog}, rel) == pytest.approx(0.2)
    two_cats = dets(([0, 0, 0.3, 0.3], 0.8), ([0.5, 0.5, 0.9, 0.9], 0.7))
    assert t2i_r1_numeracy_score({"cat": two_cats}, [("cat", 2)]) == 1.0
    assert t2i_r1_numeracy_score({"cat": two_cats}, [("cat", 3)]) == pytest.approx(0.2)
    assert t2i_r1_numeracy_score({"cat": two_cats, "dog": Detections()}, [("cat", 2), ("dog", 1)]) == 0.5
    assert t2i_r1_presence_score({"cat": two_cats, "dog": Detections()}, ["cat", "dog"]) == 0.5
    assert t2i_r1_presence_score({}, []) == 1.0
