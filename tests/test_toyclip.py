"""The learned toy reward (toyclip): persistence, the reward protocol, hard negatives, training, the stage."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from helpers import TINY_TOYCLIP, tiny_toyclip

from margrpo.rewards import build_reward
from margrpo.rewards.toyclip import ToyClip, ToyClipConfig, ToyClipReward
from margrpo.toylab.toyclip_training import default_vocabulary, evaluate_ranking, train_toyclip
from margrpo.world import WorldConfig, prompt_for_spec, relation_holds, render
from margrpo.world.captions import sample_captioned
from margrpo.world.negatives import SWAP_TYPES, hard_negatives, swap_candidates

WORLD = WorldConfig()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("toyclip") / "model"
    model = tiny_toyclip()
    model.save_pretrained(path)
    return model, path


def captioned_batch(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    items = [sample_captioned(rng, WORLD, allow_heldout=True) for _ in range(n)]
    images = torch.from_numpy(np.stack([render(s, WORLD) for s, *_ in items])).permute(0, 3, 1, 2).float() / 255
    return images, [p for _, p, _, _ in items], [{"category": c, "spec": sp} for _, _, c, sp in items]


# ------------------------------------------------------------------ persistence and the reward protocol


def test_save_load_round_trip_gives_identical_scores(saved):
    model, path = saved
    assert {p.name for p in path.iterdir()} >= {"config.json", "model.safetensors", "tokenizer"}
    assert json.loads((path / "config.json").read_text())["model_type"] == "toyclip"
    images, prompts, metadata = captioned_batch(6)
    reward = ToyClipReward(path, batch_size=6)
    model.fixed_text_length = True  # as the reward scores: prompts padded to the longest possible
    torch.testing.assert_close(reward(images, prompts, metadata), model.score(images, prompts), rtol=0, atol=0)
    model.fixed_text_length = False
    reloaded = ToyClip.from_pretrained(path)
    torch.testing.assert_close(reloaded.score(images, prompts), model.score(images, prompts), rtol=0, atol=0)


def test_an_images_score_does_not_depend_on_what_it_is_scored_with(saved):
    """Scored in batches of one fixed size (the last padded), an image's reward is the same bits alone, in a
    batch of 8 or split over processes: the learned scorers' convolutions round by batch size otherwise."""
    _, path = saved
    images, prompts, metadata = captioned_batch(8)
    reward = ToyClipReward(path, batch_size=4)
    whole = reward(images, prompts, metadata)
    for size in (1, 2, 3, 5):
        parts = [
            reward(images[i : i + size], prompts[i : i + size], metadata[i : i + size]) for i in range(0, 8, size)
        ]
        assert torch.equal(torch.cat(parts), whole), size


def test_reward_protocol_float32_per_image_in_cosine_range(saved):
    _, path = saved
    images, prompts, metadata = captioned_batch(5, seed=1)
    reward = build_reward("toyclip", path=str(path), batch_size=2)  # the registry's lazy factory; 3 chunks
    scores = reward(images, prompts, metadata)
    assert scores.dtype == torch.float32 and scores.shape == (5,)
    assert bool(((scores >= -1 - 1e-5) & (scores <= 1 + 1e-5)).all())
    assert not scores.requires_grad
    # images of another size are resized to the model's; an empty batch gives an empty score vector
    big = torch.nn.functional.interpolate(images, scale_factor=2, mode="nearest")
    assert reward(big, prompts, metadata).shape == (5,)
    assert reward(images[:0], [], []).shape == (0,)
    with pytest.raises(ValueError, match="prompts"):
        reward(images, prompts[:-1], metadata)


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer"])
def test_missing_file_is_named(saved, tmp_path, missing):
    import shutil

    _, path = saved
    copy = tmp_path / "model"
    shutil.copytree(path, copy)
    target = copy / missing
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(FileNotFoundError, match=missing):
        ToyClipReward(copy)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ToyClipReward(tmp_path / "nowhere")


def test_corrupt_weights_raise_value_error_naming_the_file(saved, tmp_path):
    import shutil

    _, path = saved
    copy = tmp_path / "model"
    shutil.copytree(path, copy)
    (copy / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ValueError, match="model.safetensors"):
        ToyClip.from_pretrained(copy)


def test_config_checks():
    with pytest.raises(ValueError, match="multiple of 8"):
        ToyClipConfig(image_size=36)
    with pytest.raises(ValueError, match="text_heads"):
        ToyClipConfig(text_width=10, text_heads=4)
    with pytest.raises(ValueError, match="Unknown text_pool"):
        ToyClipConfig(text_pool="max")
    with pytest.raises(ValueError, match="Unknown text_positions"):
        ToyClipConfig(text_positions="rotary")


def test_64px_world_uses_a_strided_stem():
    """At 64 px the first conv has stride 2, so a final position covers one 16-px grid cell."""
    cfg = ToyClipConfig(image_size=64, vocab=default_vocabulary(WORLD), **TINY_TOYCLIP)
    assert cfg.stem_stride == 2 and ToyClipConfig(image_size=32).stem_stride == 1
    model = ToyClip(cfg)
    images = torch.rand(2, 3, 64, 64)
    coords = model.image_tower.coords.expand(2, -1, -1, -1)
    assert model.image_tower.convs(torch.cat([images, coords], 1)).shape[-2:] == (4, 4)
    assert model.score(images, ["a red circle", "two squares"]).shape == (2,)


@pytest.mark.parametrize("pool", ["mean", "cls"])
@pytest.mark.parametrize("positions", ["relative", "absolute"])
def test_every_text_variant_scores(pool, positions):
    model = ToyClip(
        ToyClipConfig(vocab=default_vocabulary(WORLD), text_pool=pool, text_positions=positions, **TINY_TOYCLIP)
    )
    images, prompts, _ = captioned_batch(3)
    assert model.score(images, prompts).shape == (3,)


# ------------------------------------------------------------------ hard negatives


def brute_force_true(spec: dict, scene) -> bool:
    """Independent truth of a spec on a scene: some injective assignment of slots to objects
    matches every asked attribute (and the relation, centroids, no margin); exact counts exact."""
    objects, phrases = scene.objects, spec["objects"]

    def match(p, o) -> bool:
        return all(p[a] is None or getattr(o, a) == p[a] for a in ("color", "shape", "texture"))

    if spec["exact_count"] and any(sum(match(p, o) for o in objects) != p["count"] for p in phrases):
        return False
    slots = [i for i, p in enumerate(phrases) for _ in range(p["count"])]
    for assignment in itertools.permutations(range(len(objects)), len(slots)):
        if all(match(phrases[s], objects[o]) for s, o in zip(slots, assignment)):
            rel = spec["relation"]
            if rel is None:
                return True
            a, b = objects[assignment[slots.index(rel["a"])]], objects[assignment[slots.index(rel["b"])]]
            if relation_holds(a.centroid, b.centroid, rel["type"]):
                return True
    return False


@pytest.mark.parametrize("kind", SWAP_TYPES)
def test_swaps_kept_as_negatives_are_false_of_the_scene(kind):
    """hard_negatives / evaluation keep a swap only if false; check each kept one independently."""
    from margrpo.world.negatives import scene_objects, spec_is_true

    rng = np.random.default_rng(1)
    kept = dropped = 0
    for _ in range(300):
        scene, prompt, _, spec = sample_captioned(rng, WORLD, allow_heldout=True)
        assert brute_force_true(spec, scene), prompt  # the caption itself is true
        for cand in swap_candidates(spec, kind, WORLD):
            text = prompt_for_spec(cand)
            if spec_is_true(cand, scene_objects(scene), WORLD.image_size):
                dropped += 1
                continue
            kept += 1
            assert text != prompt
            assert not brute_force_true(cand, scene), f"{prompt!r} -> {kind} swap {text!r} is still true"
    assert kept > 20
    if kind == "binding":  # e.g. "a red circle and a blue circle" with its colours exchanged says the same
        assert dropped > 0


def test_truth_check_agrees_with_the_world_scorer():
    """spec_is_true re-implements `score_objects(...)["lenient"] == 1` for speed; they must agree."""
    from margrpo.world import score_objects
    from margrpo.world.negatives import scene_objects, spec_is_true

    rng = np.random.default_rng(3)
    checked = {True: 0, False: 0}
    for _ in range(150):
        scene, _, _, spec = sample_captioned(rng, WORLD, allow_heldout=True)
        objects = scene_objects(scene)
        for kind in SWAP_TYPES:
            for cand in [spec, *swap_candidates(spec, kind, WORLD)]:
                fast = spec_is_true(cand, objects, WORLD.image_size)
                assert fast == (score_objects(cand, objects, 0, WORLD.image_size)["lenient"] >= 1 - 1e-9), (
                    cand,
                    scene,
                )
                checked[fast] += 1
    assert min(checked.values()) > 100


def test_hard_negatives_are_false_distinct_and_typed():
    rng = np.random.default_rng(2)
    n_neg = 0
    for _ in range(300):
        scene, prompt, _, spec = sample_captioned(rng, WORLD, allow_heldout=True)
        negs = hard_negatives(scene, spec, rng, WORLD, k=6)
        texts = [prompt_for_spec(neg) for _, neg in negs]
        assert len(set(texts)) == len(texts) and prompt not in texts
        assert all(kind in SWAP_TYPES for kind, _ in negs)
        n_neg += len(negs)
    assert n_neg > 300 * 4


def test_unknown_swap_type():
    with pytest.raises(ValueError, match="Unknown swap type"):
        swap_candidates({"objects": [], "relation": None, "exact_count": False}, "size", WORLD)


# ------------------------------------------------------------------ training and evaluation


def test_tiny_training_decreases_loss_and_evaluates():
    model, info = train_toyclip(
        WORLD, steps=30, batch_size=16, lr=3e-3, width=32, seed=0, log=lambda _: None, progress=False
    )
    losses = [row["loss"] for row in info["losses"]]
    assert len(losses) == 30 and all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.1, losses
    assert not model.training
    result = evaluate_ranking(model, WORLD, n=60, seed=5)
    assert result["n"] == 60 and 0.0 <= result["overall"] <= 1.0
    assert set(result["per_type"]) <= set(SWAP_TYPES)
    assert sum(v["n"] for v in result["per_type"].values()) == 60


def test_training_is_seeded():
    def run():
        return train_toyclip(WORLD, steps=2, batch_size=4, width=8, seed=3, log=lambda _: None, progress=False)[1][
            "losses"
        ]

    assert [r["loss"] for r in run()] == [r["loss"] for r in run()]


@pytest.mark.parametrize("paired", [True, False])
def test_training_options_run(tmp_path, paired):
    model, info = train_toyclip(
        WORLD,
        steps=2,
        batch_size=4,
        width=8,
        seed=0,
        log=lambda _: None,
        progress=False,
        precision="bf16",
        paired=paired,
        out_dir=tmp_path / "model",
    )
    assert info["train_cpu_seconds"] > 0 and all(np.isfinite(r["loss"]) for r in info["losses"])
    images, prompts, _ = captioned_batch(2)
    torch.testing.assert_close(
        ToyClip.from_pretrained(tmp_path / "model").score(images, prompts), model.score(images, prompts)
    )
    with pytest.raises(ValueError, match="Unknown precision"):
        train_toyclip(WORLD, steps=1, batch_size=4, width=8, precision="fp16", progress=False)


def test_paired_batches_hold_partner_scenes():
    """A partner's caption is a compositional swap of the scene before it, and false of that scene."""
    from margrpo.toylab.toyclip_training import sample_batch

    batch = sample_batch(np.random.default_rng(4), WORLD, batch_size=32, k=2, paired=True)
    assert batch.images.shape == (32, 3, 32, 32) and len(batch.prompts) == 32
    partners = sum(batch.prompts[i + 1] in batch.negatives[i] for i in range(31))
    assert partners >= 8


# ------------------------------------------------------------------ the stage


def test_stage_cli_end_to_end(tmp_path, logged):
    from margrpo.cli import main

    world = tmp_path / "world.json"
    world.write_text(json.dumps(WORLD.to_dict()))
    out, metrics = tmp_path / "toyclip" / "model", tmp_path / "toyclip" / "metrics.json"
    cfg = {"enabled": True, "steps": 3, "batch_size": 4, "lr": 0.001, "width": 8, "seed": 0}
    argv = [
        "train-toyclip",
        "--world",
        str(world),
        "--config-json",
        json.dumps(cfg),
        "--out-dir",
        str(out),
        "--metrics",
        str(metrics),
        "--eval-n",
        "24",
        "--threads",
        "1",
    ]
    assert main(argv) == 0
    m = json.loads(metrics.read_text())
    assert 0.0 <= m["heldout_ranking_accuracy"] <= 1.0 and m["steps"] == 3 and m["n_triples"] == 24
    assert set(m["per_swap_type"]) <= set(SWAP_TYPES) and m["train_seconds"] > 0
    assert "held-out ranking accuracy" in logged()
    images, prompts, metadata = captioned_batch(3)
    assert ToyClipReward(out)(images, prompts, metadata).shape == (3,)
    # a second run replaces the model folder; no temp folders are left behind; usual permissions
    assert main(argv) == 0
    assert sorted(p.name for p in out.parent.iterdir()) == ["metrics.json", "model", "spec.json"]
    assert out.stat().st_mode & 0o755 == 0o755 and (out / "model.safetensors").stat().st_mode & 0o644 == 0o644


def test_stage_rejects_unknown_config_keys(tmp_path):
    from margrpo.cli import main

    world = tmp_path / "world.json"
    world.write_text(json.dumps(WORLD.to_dict()))
    with pytest.raises(SystemExit, match="unknown key"):
        main(
            [
                "train-toyclip",
                "--world",
                str(world),
                "--config-json",
                '{"stepz": 3}',
                "--out-dir",
                str(tmp_path / "m"),
                "--metrics",
                str(tmp_path / "m.json"),
            ]
        )
