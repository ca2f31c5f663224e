"""toypref, the toy preference reward (the HPS analogue): it ranks held-out pairs, saves and loads with its checksums,
and plugs into the reward registry."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from margrpo.rewards import build_reward_mix
from margrpo.rewards.toypref import ToyPref, ToyPrefReward
from margrpo.stages._common import reward_options
from margrpo.toylab.toyclip_training import train_toyclip
from margrpo.toylab.toypref_training import evaluate_pairs, sample_pairs, train_toypref
from margrpo.world import WorldConfig

WORLD = WorldConfig(backdrop_range=(0.0, 0.2))  # the 32-px world, lit: cheap to train on


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    clip, _ = train_toyclip(WORLD, steps=150, batch_size=32, width=32, log=lambda s: None, progress=False)
    pref, info = train_toypref(clip, WORLD, steps=60, batch_size=32, log=lambda s: None, progress=False)
    return clip, pref, info


def test_held_out_pairs_are_ranked_each_kind_reported_apart(trained):
    clip, pref, _ = trained
    acc = evaluate_pairs(pref, WORLD, n=400)
    print({k: round(v["accuracy"], 3) for k, v in acc.items()})  # alignment / aesthetic / hard alignment, apart
    assert acc["aesthetic"]["n"] == acc["alignment"]["n"] == 200
    assert acc["aesthetic"]["accuracy"] >= 0.95  # the backdrop is learned
    assert acc["alignment"]["accuracy"] >= 0.55  # a short toyclip: above chance (the pipeline's: docs/toy-world.md)
    assert acc["overall"]["accuracy"] >= 0.75
    # the aesthetic tower separates aesthetic pairs, the alignment term alignment pairs
    assert acc["aesthetic"]["aesthetic_margin"] > 0 and acc["alignment"]["alignment_margin"] > 0
    assert 0 < acc["alignment_loser_brighter"]["n"] < 200


def test_pairs_prefer_the_aligned_image_and_the_brighter_backdrop():
    pairs = sample_pairs(np.random.default_rng(0), WORLD, 40)
    assert pairs["kinds"].count("alignment") == pairs["kinds"].count("aesthetic") == 20
    for kind, (win, lose) in zip(pairs["kinds"], pairs["backdrops"]):
        if kind == "aesthetic":
            assert win >= lose + 0.02
    assert pairs["winners"].shape == pairs["losers"].shape == (40, 3, 32, 32)
    with pytest.raises(ValueError, match="backdrop_max"):
        sample_pairs(np.random.default_rng(0), WorldConfig(), 4)


def test_save_load_round_trip_and_the_registry_reward(trained, tmp_path):
    _, pref, _ = trained
    pref.save_pretrained(tmp_path / "toypref")
    images = sample_pairs(np.random.default_rng(1), WORLD, 8)["winners"]
    prompts = ["a red circle"] * 8
    loaded = ToyPref.from_pretrained(tmp_path / "toypref")
    with torch.no_grad():
        assert torch.allclose(pref(images, prompts), loaded(images, prompts))
    mix = build_reward_mix({"toypref": 1.0}, reward_options({"toypref": 1.0}, {}, None, str(tmp_path / "toypref")))
    total, parts = mix(images, prompts, [{}] * 8)
    assert total.dtype == torch.float32 and total.shape == (8,) and torch.isfinite(total).all()
    assert torch.allclose(total, ToyPrefReward(tmp_path / "toypref")(images, prompts, [{}] * 8))


def test_a_flipped_weight_or_a_missing_folder_is_named(trained, tmp_path):
    _, pref, _ = trained
    folder = tmp_path / "toypref"
    pref.save_pretrained(folder)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(Exception, match="model.safetensors"):
        ToyPref.from_pretrained(folder)
    with pytest.raises(FileNotFoundError, match="train-toypref"):
        ToyPref.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(Exception, match="--toypref-dir"):
        reward_options({"toypref": 1.0}, {}, None, None)


def test_backdrop_metric_is_registered_and_exact():
    from margrpo.world import render, sample_scene
    from margrpo.world.scene import Scene

    scene = sample_scene(np.random.default_rng(0), WORLD)
    images = torch.stack(
        [
            torch.from_numpy(render(Scene(scene.objects, b), WORLD)).permute(2, 0, 1).float() / 255
            for b in (0.0, 0.1, 0.2)
        ]
    )
    mix = build_reward_mix({"backdrop": 1.0})
    total, _ = mix(images, [""] * 3, [{}] * 3)
    assert torch.allclose(total, torch.tensor([0.0, 0.1, 0.2]), atol=1 / 255)


def test_stage_cli_writes_the_model_and_per_kind_metrics(tmp_path, trained):
    from margrpo.cli import main
    from margrpo.infra.files import atomic_write_json

    clip, _, _ = trained
    clip.save_pretrained(tmp_path / "toyclip")
    atomic_write_json(tmp_path / "world.json", WORLD.to_dict())
    rc = main(
        [
            "train-toypref",
            "--world",
            str(tmp_path / "world.json"),
            "--toyclip-dir",
            str(tmp_path / "toyclip"),
            "--config-json",
            json.dumps({"steps": 3, "batch_size": 8}),
            "--out-dir",
            str(tmp_path / "out" / "model"),
            "--metrics",
            str(tmp_path / "out" / "metrics.json"),
            "--eval-n",
            "20",
            "--threads",
            "1",
        ]
    )
    assert rc in (0, None)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert set(metrics["per_pair_kind"]) == {"overall", "alignment", "aesthetic", "alignment_loser_brighter"}
    assert ToyPref.from_pretrained(tmp_path / "out" / "model") is not None
    assert json.loads((tmp_path / "out" / "spec.json").read_text())["config_json"]["steps"] == 3
