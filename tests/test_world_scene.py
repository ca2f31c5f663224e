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
    [
        ((20, 8), {"left of", "next to"}),
        ((0, 8), {"right of", "next to"}),
        ((8, 24), {"above"}),
        ((8, -9), {"below"}),
        ((20, 20), set()),
    ],
)
def test_relations_need_a_dominant_axis(b, holds):
    got = {r for r in ("left of", "right of", "above", "below", "next to") if relation_holds((8, 8), b, r, margin=1.0)}
    assert got == holds


# ---------------------------------------------------------------- the backdrop: the world's aesthetic


@pytest.mark.parametrize("backdrop", [0.0, 0.05, 0.1, 0.2])
def test_backdrop_level_reads_a_render_exactly_and_the_parser_sees_the_same_scene(backdrop):
    from margrpo.world import score
    from margrpo.world.captions import sample_captioned
    from margrpo.world.scene import backdrop_level

    cfg = PRESETS["grid4-lit"]
    rng = np.random.default_rng(3)
    for _ in range(12):
        scene, _, category, spec = sample_captioned(rng, cfg)
        image = render(Scene(scene.objects, backdrop), cfg)
        assert abs(float(backdrop_level(image)) - backdrop) <= 1 / 255  # one grey level: the uint8 rounding
        assert score(spec, image, category, cfg)["strict"] == 1.0  # same objects on any backdrop of the range


def test_backdrop_level_is_per_image_and_counts_an_all_foreground_image_as_the_threshold():
    from margrpo.world.scene import backdrop_level

    cfg = PRESETS["grid4-lit"]
    scene = sample_scene(np.random.default_rng(0), cfg)
    batch = np.stack([render(Scene(scene.objects, b), cfg) for b in (0.02, 0.18)])
    assert np.allclose(backdrop_level(batch), [0.02, 0.18], atol=1 / 255)
    assert float(backdrop_level(np.full((8, 8, 3), 200, np.uint8))) == 0.5


def test_scenes_draw_backdrops_over_the_range_and_an_unlit_world_stays_black():
    lit, unlit = PRESETS["grid4-lit"], PRESETS["grid4"]
    draws = [sample_scene(np.random.default_rng(s), lit).backdrop for s in range(200)]
    assert 0.0 <= min(draws) < 0.02 and 0.18 < max(draws) <= 0.2
    assert {sample_scene(np.random.default_rng(s), unlit).backdrop for s in range(20)} == {0.0}
    # an unlit world draws nothing for the backdrop: its scenes are those of toy revision 2
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    sample_scene(a, unlit)
    sample_scene(b, unlit)
    assert a.integers(1 << 30) == b.integers(1 << 30)
    assert render(sample_scene(np.random.default_rng(1), unlit), unlit)[0, 0].tolist() == [0, 0, 0]


def test_a_backdrop_near_the_foreground_threshold_is_refused():
    with pytest.raises(ValueError, match="backdrop_range"):
        WorldConfig(backdrop_range=(0.0, 0.45))
