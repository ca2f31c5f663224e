"""Verifiable scoring: 1 for a render of the spec, < 1 for one violated constraint, not gameable."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from margrpo.world import CATEGORIES, ObjectSpec, Scene, WorldConfig, render, scene_for_spec, score
from margrpo.world.captions import sample_captioned
from margrpo.world.reward import ShapesReward

CFG = WorldConfig()


def phrase(color=None, shape=None, texture=None, count=1):
    return {"color": color, "shape": shape, "texture": texture, "count": count}


def spec(*objects, relation=None, exact=False):
    return {"objects": list(objects), "relation": relation, "exact_count": exact}


def obj(color, shape, texture="solid", cell=0):
    x, y = [(8.0, 8.0), (24.0, 8.0), (8.0, 24.0), (24.0, 24.0)][cell]
    return ObjectSpec(color, shape, texture, 12, x, y)


def image_of(*objects):
    return render(Scene(tuple(objects)), CFG)


# category -> (spec, a faithful scene, the same scene with one constraint violated)
CASES = {
    "color": (
        spec(phrase("red", "circle"), phrase("blue", "square")),
        [obj("red", "circle"), obj("blue", "square", cell=3)],
        [obj("green", "circle"), obj("blue", "square", cell=3)],
    ),  # wrong colour
    "shape": (
        spec(phrase(shape="circle"), phrase(shape="triangle")),
        [obj("red", "circle"), obj("cyan", "triangle", cell=1)],
        [obj("red", "circle"), obj("cyan", "square", cell=1)],
    ),  # wrong shape
    "texture": (
        spec(phrase(shape="triangle", texture="hollow"), phrase("red", "circle", "solid")),
        [obj("blue", "triangle", "hollow"), obj("red", "circle", cell=2)],
        [obj("blue", "triangle", "solid"), obj("red", "circle", cell=2)],
    ),  # wrong texture
    "spatial": (
        spec(phrase("red", "circle"), phrase(shape="square"), relation={"type": "left of", "a": 0, "b": 1}),
        [obj("red", "circle", cell=0), obj("green", "square", cell=1)],
        [obj("red", "circle", cell=1), obj("green", "square", cell=0)],
    ),  # wrong relation
    "numeracy": (
        spec(phrase(shape="square", count=3), exact=True),
        [obj("red", "square"), obj("blue", "square", cell=1), obj("cyan", "square", cell=3)],
        [obj("red", "square"), obj("blue", "square", cell=1)],
    ),  # wrong count
    "complex": (
        spec(phrase("red", "circle", count=2), phrase("blue", "square"), exact=True),
        [obj("red", "circle"), obj("red", "circle", cell=1), obj("blue", "square", cell=2)],
        [obj("red", "circle"), obj("red", "circle", cell=1), obj("blue", "triangle", cell=2)],
    ),  # wrong shape
}


@pytest.mark.parametrize("category", CATEGORIES)
def test_faithful_render_scores_one_and_a_violation_less(category):
    s, good, bad = CASES[category]
    r = score(s, image_of(*good), category, CFG)
    assert r["strict"] == r["lenient"] == 1.0
    r = score(s, image_of(*bad), category, CFG)
    assert r["strict"] < 1.0 and r["lenient"] < 1.0
    assert r["lenient"] > 0.0  # partial credit: the rest of the prompt is still right


@pytest.mark.parametrize("category", CATEGORIES)
def test_reference_renders_of_suite_specs_score_one(category):
    rng = np.random.default_rng(3)
    for _ in range(10):
        _, _, _, s = sample_captioned(rng, CFG, category, allow_heldout=True)
        assert score(s, render(scene_for_spec(s, rng, CFG), CFG), category, CFG)["strict"] == 1.0


def test_terms_a_spec_does_not_ask_are_nan():
    s, good, _ = CASES["color"]
    r = score(s, image_of(*good), "color", CFG)
    assert math.isnan(r["relation"]) and math.isnan(r["count"]) and r["binding"] == 1.0


def test_relation_between_right_colours_gets_half_credit():
    s = spec(phrase("red", "circle"), phrase("blue", "square"), relation={"type": "above", "a": 0, "b": 1})
    r = score(s, image_of(obj("red", "triangle", cell=0), obj("blue", "triangle", cell=2)), "spatial", CFG)
    assert r["relation"] == 0.5 and 0 < r["binding"] < 1


def test_spraying_fragments_lowers_strict_not_lenient():
    s, good, _ = CASES["color"]
    clean = image_of(*good)
    sprayed = clean.copy()
    for k, (y, x) in enumerate([(1, 17), (1, 29), (30, 1), (30, 13), (14, 15), (20, 1)]):
        sprayed[y : y + 2, x : x + 2] = [(255, 0, 0), (0, 255, 0), (0, 0, 255)][k % 3]
    a, b = score(s, clean, "color", CFG), score(s, sprayed, "color", CFG)
    assert b["fragments"] == 6 and b["lenient"] == a["lenient"] == 1.0
    assert b["strict"] < 0.5


def test_spraying_objects_lowers_strict_not_lenient():
    s = spec(phrase("red", "circle"))
    r = score(
        s,
        image_of(
            obj("red", "circle"),
            obj("green", "square", cell=1),
            obj("blue", "triangle", cell=2),
            obj("red", "circle", cell=3),
        ),
        "color",
        CFG,
    )
    assert r["lenient"] == 1.0 and r["extra_objects"] == 3 and r["strict"] == pytest.approx(0.25)


def test_score_rejects_unknown_category_and_bad_spec():
    s, good, _ = CASES["color"]
    with pytest.raises(ValueError, match="Unknown category"):
        score(s, image_of(*good), "3d_spatial", CFG)
    with pytest.raises(ValueError, match="unknown color"):
        score(spec(phrase("mauve", "circle")), image_of(*good), "color", CFG)


def test_shapes_reward_batch():
    names = ["color", "numeracy"]
    images = np.stack(
        [image_of(*CASES[c][1]) for c in names] + [image_of(*CASES[c][2]) for c in names]
    )  # (4, H, W, 3)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255  # (4, 3, H, W) in [0, 1]
    metadata = [{"spec": CASES[c][0], "category": c} for c in names * 2]
    for form in ("strict", "lenient"):
        r = ShapesReward(form)(x, ["unused"] * 4, metadata)
        assert r.shape == (4,) and r.dtype == torch.float32 and r.device == x.device
        assert r[:2].tolist() == [1.0, 1.0] and (r[2:] < 1).all()
    with pytest.raises(ValueError, match="Unknown form"):
        ShapesReward("harsh")
    with pytest.raises(ValueError, match="lack 'spec'"):
        ShapesReward()(x, ["p"] * 4, [{"category": "color"}] * 4)
    with pytest.raises(ValueError, match=r"\(B, 3, H, W\)"):
        ShapesReward()(x[0], ["p"], metadata[:1])


@pytest.mark.parametrize("snap", [True, False])
@pytest.mark.parametrize("kind", ["left of", "right of", "above", "below", "next to"])
def test_scene_for_spec_honours_relations_either_way_round(kind, snap):
    cfg = dataclasses.replace(CFG, snap=snap, max_objects=2 if not snap else CFG.max_objects)
    s = spec(phrase(shape="triangle"), phrase("red", "circle"), relation={"type": kind, "a": 1, "b": 0})
    rng = np.random.default_rng(0)
    for _ in range(5):
        assert score(s, render(scene_for_spec(s, rng, cfg), cfg), "spatial", cfg)["strict"] == 1.0
