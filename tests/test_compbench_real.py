"""T2I-CompBench evaluator for real samples (margrpo.evaluation.compbench) with tiny local models."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from builders_real import dets, tiny_blip_vqa, tiny_clip, tiny_grounding_dino
from PIL import Image

from margrpo.evaluation.compbench import (
    CompBenchEvaluator,
    canonical_category,
    compbench_count,
    compbench_numeracy_score,
    compbench_spatial_score,
    evaluate_directory,
    list_samples,
    parse_sample_name,
    unidet_frame,
)
from margrpo.prompts.analysis import parse_counts, parse_relation
from margrpo.prompts.files import COMPBENCH_DIR as DATA
from margrpo.prompts.files import read_prompt_file
from margrpo.rewards.real.detection import Detections


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_compbench")
    return {
        "vqa_path": str(tiny_blip_vqa(root / "blip")),
        "detector_path": str(tiny_grounding_dino(root / "gdino")),
        "clip_path": str(tiny_clip(root / "clip")),
        "detector_options": {"box_threshold": 0.0},  # random weights: keep every box so the scores move
    }


def write_samples(directory, prompts, per_prompt=2, size=48, seed=0):
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for p in prompts:
        for i in range(per_prompt):
            pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(directory / f"{p}_{i:06d}.png")
    return directory


# ============================================================================ layout


def test_parse_sample_name():
    assert parse_sample_name("a red bench and a blue bowl_000003.png") == ("a red bench and a blue bowl", 3)
    assert parse_sample_name("The red hat was on top of the brown coat rack._000010.png") == (
        "The red hat was on top of the brown coat rack.",
        10,
    )
    for bad in ("a red bench.png", "a red bench_3.png", "a red bench_000003.jpg", "_000001.png"):
        with pytest.raises(ValueError, match=rf"{bad!r}.*{{prompt}}_{{index:06d}}\.png"):
            parse_sample_name(bad)


def test_list_samples_layout_and_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_samples(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no PNG samples in .*empty"):
        list_samples(tmp_path / "empty")
    run = tmp_path / "run"
    write_samples(run / "samples", ["two cats", "a dog"], per_prompt=2)
    found = list_samples(run)  # the parent of samples/ works too
    assert [(s.prompt, s.index) for s in found] == [("a dog", 0), ("a dog", 1), ("two cats", 0), ("two cats", 1)]
    Image.new("RGB", (8, 8)).save(run / "samples" / "two cats-1.png")
    with pytest.raises(ValueError, match=r"1 file name\(s\) are not .*'two cats-1\.png'"):
        list_samples(run)


def test_categories():
    assert canonical_category("2d_spatial") == "spatial" and canonical_category("non-spatial") == "non_spatial"
    with pytest.raises(ValueError, match="depth model"):
        canonical_category("3d_spatial")
    with pytest.raises(ValueError, match="Unknown category"):
        canonical_category("style")


def test_prompt_files_parse():
    """Every 2-D spatial and numeracy evaluation prompt is understood by the rules."""
    spatial = [r.prompt for r in read_prompt_file(f"{DATA}/spatial_val.txt", "spatial")]
    numeracy = [r.prompt for r in read_prompt_file(f"{DATA}/numeracy_val.txt", "numeracy")]
    assert len(spatial) >= 299 and len(numeracy) >= 299
    assert all(parse_relation(p) is not None for p in spatial)
    assert all(parse_counts(p) for p in numeracy)
    assert parse_counts("four tents, three pigs, one cow and four paddles") == [
        ("tent", 4),
        ("pig", 3),
        ("cow", 1),
        ("paddle", 4),
    ]


# ============================================================================ metric formulas (hand-computed)


def test_compbench_spatial_score():
    dog, bench = dets(([0.0, 0.4, 0.2, 0.6], 0.8)), dets(([0.6, 0.4, 0.8, 0.6], 0.6))
    left = ("dog", "bench", "on the left of")
    assert compbench_spatial_score({"dog": dog, "bench": bench}, *left) == pytest.approx(0.25 * 0.8 + 0.25 * 0.6 + 0.5)
    assert compbench_spatial_score({"dog": bench, "bench": dog}, *left) == 0.0  # 0.35 < 0.5 -> 0
    assert compbench_spatial_score({"dog": dog}, *left) == 0.0  # 0.2 < 0.5 -> 0
    assert compbench_spatial_score({"dog": dog, "bench": bench}, "dog", "bench", "on top of") == 0.0  # no rule: 0.35
    # overlapping boxes, right direction: position = 0.1 / IoU; IoU of [0,0,1,1] and [0.5,0,1.5,1] = 1/3
    a, b = dets(([0, 0, 1, 1], 1.0)), dets(([0.5, 0, 1.5, 1], 1.0))
    assert compbench_spatial_score({"dog": a, "bench": b}, *left) == pytest.approx(0.5 + 0.3 / 2)
    # the most confident box of each object is used
    dog2 = dets(([0.9, 0.4, 1.0, 0.6], 0.3), ([0.0, 0.4, 0.2, 0.6], 0.8))
    assert compbench_spatial_score({"dog": dog2, "bench": bench}, *left) == pytest.approx(0.85)


def test_compbench_numeracy_score():
    cats = dets(([0, 0, 0.3, 0.3], 0.8), ([0.02, 0, 0.32, 0.3], 0.6), ([0.5, 0.5, 0.9, 0.9], 0.7))  # 2 after NMS
    assert compbench_numeracy_score({"cat": cats}, [("cat", 2)]) == 1.0
    assert compbench_numeracy_score({"cat": cats}, [("cat", 3)]) == 0.5
    assert compbench_numeracy_score({"cat": cats, "dog": Detections()}, [("cat", 2), ("dog", 1)]) == 0.5
    assert compbench_numeracy_score({}, []) == 0.0
    nested = dets(([0.1, 0.1, 0.9, 0.9], 0.9), ([0.2, 0.2, 0.5, 0.5], 0.8))  # IoU 0.14: NMS keeps both,
    assert compbench_count(nested) == 1  # but the small box lies inside the large one: one object
    assert unidet_frame(512, 512) == (479, 479) and unidet_frame(512, 768) == (320, 480)


def test_complex_three_in_one_rule(tmp_path):
    """Sub-split prompts average two parts (T2I-CompBench's 3_in_1.py); others all three."""

    class Const:
        def __init__(self, v):
            self.v = v

        def __call__(self, images, prompts, metadata):
            return torch.full((len(prompts),), self.v)

    ev = CompBenchEvaluator(
        clip=Const(0.3),
        complex_spatial=["The cat was next to the dog."],
        complex_action=["The red car zoomed past the tree."],
    )
    ev.attribute = lambda images, prompts: torch.full((len(prompts),), 0.8)
    ev.spatial = lambda images, prompts: (torch.full((len(prompts),), 0.5), [True] * len(prompts))
    prompts = ["The cat was next to the dog.", "the red car zoomed past the tree", "The blue cup held hot tea."]
    out = ev.score("complex", torch.zeros(3, 3, 8, 8), prompts)
    assert out["complex_kind"] == ["spatial", "action", "all"]
    assert out["score"] == pytest.approx([(0.8 + 0.5) / 2, (0.8 + 0.3) / 2, (0.8 + 0.5 + 0.3) / 3])
    assert out["attribute"] == pytest.approx([0.8] * 3)


def test_missing_models_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"'spatial' needs detector_path \(Grounding DINO\)"):
        CompBenchEvaluator.from_paths("spatial")
    with pytest.raises(FileNotFoundError, match=r"blip not found.*config\.json"):
        CompBenchEvaluator.from_paths("color", vqa_path=str(tmp_path / "blip"))
    with pytest.raises(ValueError, match="needs a BLIP-VQA scorer"):
        CompBenchEvaluator().score("texture", torch.zeros(1, 3, 8, 8), ["a fluffy cat"])


# ============================================================================ end to end


@pytest.mark.parametrize(
    "category, prompts",
    [
        ("color", ["a green bench and a blue bowl", "a red book and a blue cake"]),
        ("spatial", ["a bee on the right of a refrigerator", "a giraffe next to a lamp"]),
        ("numeracy", ["two dogs", "four tents, two boats and one pig"]),
        ("non_spatial", ["A dog is chasing after a ball and wagging its tail."]),
    ],
)
def test_end_to_end_on_pngs(tmp_path, models, category, prompts):
    samples = write_samples(tmp_path / "out" / "samples", prompts, per_prompt=2)
    per_image, summary = evaluate_directory(
        tmp_path / "out", category, out_json=tmp_path / "scores.json", out_csv=tmp_path / "scores.csv", **models
    )
    assert len(per_image) == 2 * len(prompts) == summary["n_images"]
    assert summary["n_prompts"] == len(prompts) and summary["category"] == category
    assert summary["mean"] == pytest.approx(per_image["score"].mean())
    assert np.isfinite(per_image["score"]).all()
    lo, hi = (-1, 1) if category == "non_spatial" else (0, 1)
    assert per_image["score"].between(lo, hi).all()
    assert sorted(per_image["file"]) == sorted(p.name for p in samples.glob("*.png"))
    saved = json.loads((tmp_path / "scores.json").read_text())
    assert saved["summary"] == summary and len(saved["per_image"]) == len(per_image)
    csv = pd.read_csv(tmp_path / "scores.csv")
    np.testing.assert_allclose(csv["score"], per_image["score"], rtol=1e-6)
    if category in ("spatial", "numeracy"):
        assert summary["n_unparsed"] == 0


def test_end_to_end_complex_with_subsplits(tmp_path, models):
    prompts = [
        read_prompt_file(f"{DATA}/complex_val_{kind}.txt", "complex")[0].prompt for kind in ("spatial", "action")
    ]
    write_samples(tmp_path / "samples", prompts, per_prompt=1)
    evaluator = CompBenchEvaluator.from_paths("complex", prompts_dir=DATA, **models)
    per_image, summary = evaluator.evaluate(tmp_path / "samples", "complex")
    kinds = dict(zip(per_image["prompt"], per_image["complex_kind"]))
    assert kinds == {prompts[0]: "spatial", prompts[1]: "action"}
    row = per_image.set_index("prompt")
    assert row.loc[prompts[0], "score"] == pytest.approx(
        (row.loc[prompts[0], "attribute"] + row.loc[prompts[0], "spatial"]) / 2
    )
    assert row.loc[prompts[1], "score"] == pytest.approx(
        (row.loc[prompts[1], "attribute"] + row.loc[prompts[1], "non_spatial"]) / 2
    )
    assert summary["metric"] == "3_in_1"


def test_scores_do_not_depend_on_batch_size(tmp_path, models):
    write_samples(tmp_path / "samples", ["a red book and a blue cake", "two dogs", "a bee near a desk"], per_prompt=2)
    one = CompBenchEvaluator.from_paths("complex", batch_size=1, **models).evaluate(tmp_path / "samples", "complex")[0]
    many = CompBenchEvaluator.from_paths("complex", batch_size=4, **models).evaluate(tmp_path / "samples", "complex")[
        0
    ]
    np.testing.assert_allclose(one["score"], many["score"], atol=1e-5)


def test_eval_compbench_stage_scores_a_mixed_suite_per_category(tmp_path, models):
    """`margrpo eval-compbench --evaluator t2i-compbench`: the workflow's entry point, one row per category."""
    from margrpo.cli import main
    from margrpo.prompts.suites import write_suite

    suite = tmp_path / "eval.jsonl"
    color = tmp_path / "color_val.txt"
    color.write_text("a green bench and a blue bowl\n")
    numeracy = tmp_path / "numeracy_val.txt"
    numeracy.write_text("two dogs\n")
    write_suite(read_prompt_file(color, "color") + read_prompt_file(numeracy, "numeracy"), suite)
    write_samples(tmp_path / "samples", ["a green bench and a blue bowl", "two dogs"], per_prompt=2)
    spec = {
        "vqa": {"path": models["vqa_path"]},
        "detector": {"path": models["detector_path"], "box_threshold": 0.0},
        "clip": {"path": models["clip_path"]},
    }
    main(
        [
            "eval-compbench",
            "--samples-dir",
            str(tmp_path / "samples"),
            "--suite",
            str(suite),
            "--evaluator",
            "t2i-compbench",
            "--images-per-prompt",
            "2",
            "--models-json",
            json.dumps(spec),
            "--out-per-image",
            str(tmp_path / "img.csv"),
            "--out-per-category",
            str(tmp_path / "cat.csv"),
        ]
    )
    cats = pd.read_csv(tmp_path / "cat.csv")
    assert list(cats["category"]) == ["color", "numeracy"] and list(cats["n_images"]) == [2, 2]
    assert np.isfinite(cats["strict"]).all() and (cats["strict"] == cats["lenient"]).all()
    assert len(pd.read_csv(tmp_path / "img.csv")) == 4
    with pytest.raises(SystemExit, match="needs evaluation.compbench_models entries"):
        main(
            [
                "eval-compbench",
                "--samples-dir",
                str(tmp_path / "samples"),
                "--suite",
                str(suite),
                "--evaluator",
                "t2i-compbench",
                "--images-per-prompt",
                "2",
                "--models-json",
                "{}",
                "--out-per-image",
                str(tmp_path / "i2.csv"),
                "--out-per-category",
                str(tmp_path / "c2.csv"),
            ]
        )
