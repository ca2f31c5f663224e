"""ShapesWorld config, scenes and renderer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from margrpo.world import PRESETS, ObjectSpec, Scene, WorldConfig, render, sample_scene
from margrpo.world.scene import relation_holds


def test_render_is_deterministic_per_seed():
    cfg = WorldConfig()
    a = [render(sample_scene(np.random.default_rng(7), cfg), cfg) for _ in range(2)]
    b = render(sample_scene(np.random.default_rng(8), cfg), cfg)
    assert a[0].shape == (32, 32, 3) and a[0].dtype == np.uint8
    np.testing.assert_array_equal(a[0], a[1])
    assert not np.array_equal(a[0], b)


def test_render_draws_colour_on_black():
    cfg = WorldConfig()
    image = render(Scene((ObjectSpec("red", "square", "solid", 12, 8.0, 8.0),)), cfg)
    assert tuple(image[8, 8]) == (255, 0, 0) and tuple(image[24, 24]) == (0, 0, 0)
    hollow = render(Scene((ObjectSpec("blue", "circle", "hollow", 12, 8.0, 8.0),)), cfg)
    assert tuple(hollow[8, 8]) == (0, 0, 0) and hollow[8, 2, 2] == 255  # empty centre, painted rim


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_scenes_keep_objects_apart_and_inside(preset):
    cfg = PRESETS[preset]
    rng = np.random.default_rng(0)
    for _ in range(50):
        objs = sample_scene(rng, cfg).objects
        assert 1 <= len(objs) <= cfg.max_objects
        for i, a in enumerate(objs):
            assert 0 <= a.bbox[0] and a.bbox[2] <= cfg.image_size and 0 <= a.bbox[1] and a.bbox[3] <= cfg.image_size
            for b in objs[:i]:
                gap = max(b.bbox[0] - a.bbox[2], a.bbox[0] - b.bbox[2], b.bbox[1] - a.bbox[3], a.bbox[1] - b.bbox[3])
                assert gap >= cfg.min_gap_px


def test_training_scenes_never_show_heldout_pairs():
    cfg = WorldConfig()
    pairs = cfg.heldout_pairs()
    assert len(pairs) == cfg.n_heldout_pairs and len({c for c, _ in pairs}) == len(pairs)
    rng = np.random.default_rng(0)
    seen = {(o.color, o.shape) for _ in range(300) for o in sample_scene(rng, cfg).objects}
    assert not seen & pairs
    seen_all = {(o.color, o.shape) for _ in range(300) for o in sample_scene(rng, cfg, allow_heldout=True).objects}
    assert pairs <= seen_all


def test_config_round_trips_through_json():
    cfg = WorldConfig(palette=("red", "green", "blue"), max_objects=3)
    assert WorldConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"size_range": (11, 14)}, "lower size_range max to 12"),
        ({"image_size": 16}, "outside 32..64"),
        ({"palette": ("red", "mauve")}, "palette"),
        ({"max_objects": 5}, "raise grid"),
        ({"min_gap_px": 2}, "min_gap_px >= 4"),
        ({"snap": False}, "use snap=True"),
    ],
)
def test_config_errors_say_how_to_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WorldConfig(**kwargs)


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown WorldConfig keys"):
        WorldConfig.from_dict({"image_size": 32, "colour_count": 3})


@pytest.mark.parametrize(
    "b, holds",
    [((20, 8), {"left of", "next to"}), ((0, 8), {"right of", "next to"}), ((8, 24), {"above"}), ((8, -9), {"below"}), ((20, 20), set())],
)
def test_relations_need_a_dominant_axis(b, holds):
    got = {r for r in ("left of", "right of", "above", "below", "next to") if relation_holds((8, 8), b, r, margin=1.0)}
    assert got == holds
