"""Captions, prompt suites (balance, disjointness, unseen combinations), suite files and stages."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from PIL import Image

from margrpo.prompts.shapesworld import build_suites
from margrpo.prompts.suites import load_suite, write_suite
from margrpo.world import (
    CATEGORIES,
    WorldConfig,
    canonical_key,
    caption_scene,
    heldout_in_spec,
    prompt_for_spec,
    prompt_vocabulary,
    render,
    sample_scene,
    scene_for_spec,
    validate_spec,
)

CFG = WorldConfig()


@pytest.fixture(scope="module")
def suites():
    return build_suites(CFG, seed=0, n_train=120, n_val=24, n_eval=60)


def test_suites_are_balanced_disjoint_and_hold_out_combinations(suites):
    heldout = CFG.heldout_pairs()
    for split, n in (("train", 120), ("val", 24), ("eval", 60)):
        records = suites[split]
        assert len(records) == n
        assert [sum(r.category == c for r in records) for c in CATEGORIES] == [n // len(CATEGORIES)] * len(CATEGORIES)
    texts = {s: {r.prompt for r in rs} for s, rs in suites.items()}
    keys = {s: {canonical_key(r.spec) for r in rs} for s, rs in suites.items()}
    for a, b in (("train", "val"), ("train", "eval"), ("val", "eval")):
        assert not texts[a] & texts[b] and not keys[a] & keys[b]
    assert not any(heldout_in_spec(r.spec, heldout) for r in suites["train"] + suites["val"])
    assert sum(heldout_in_spec(r.spec, heldout) for r in suites["eval"]) >= len(suites["eval"]) // 3


def test_prompts_are_their_specs_in_words_without_underscores(suites):
    vocab = set(prompt_vocabulary(CFG))
    for r in (r for rs in suites.values() for r in rs):
        validate_spec(r.spec, CFG)
        assert r.prompt == prompt_for_spec(r.spec) and "_" not in r.prompt
        assert set(r.prompt.replace(",", " ,").split()) <= vocab


def test_suites_are_deterministic_per_seed(suites):
    again = build_suites(CFG, seed=0, n_train=120, n_val=24, n_eval=60)
    assert again == suites
    assert build_suites(CFG, seed=1, n_train=120, n_val=24, n_eval=60)["eval"] != suites["eval"]


def test_canonical_key_ignores_word_order_and_mirroring():
    red, square = (
        {"color": "red", "shape": "circle", "texture": None, "count": 1},
        {"color": None, "shape": "square", "texture": None, "count": 1},
    )
    left = {"objects": [red, square], "relation": {"type": "left of", "a": 0, "b": 1}, "exact_count": False}
    right = {"objects": [square, red], "relation": {"type": "right of", "a": 0, "b": 1}, "exact_count": False}
    assert prompt_for_spec(left) == "a red circle on the left of a square"
    assert prompt_for_spec(right) == "a square on the right of a red circle"
    assert canonical_key(left) == canonical_key(right)
    both = {"objects": [red, square], "relation": None, "exact_count": False}
    assert canonical_key(both) == canonical_key(both | {"objects": [square, red]})


def test_caption_scene_refuses_a_category_that_does_not_fit():
    rng = np.random.default_rng(0)
    one = sample_scene(rng, CFG, n_objects=1)
    with pytest.raises(ValueError, match="no spatial caption"):
        caption_scene(one, rng, "spatial")
    prompt, category, spec = caption_scene(one, rng)
    assert category in CATEGORIES and prompt == prompt_for_spec(spec)


def test_scene_for_spec_refuses_too_many_objects():
    spec = {
        "objects": [{"color": None, "shape": "circle", "texture": None, "count": 5}],
        "relation": None,
        "exact_count": True,
    }
    with pytest.raises(ValueError, match="max_objects"):
        scene_for_spec(spec, np.random.default_rng(0), CFG)


def test_suite_file_round_trip(tmp_path, suites):
    path = write_suite(suites["val"], tmp_path / "val.jsonl")
    assert load_suite(path) == suites["val"]
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary file was renamed away


GOOD = {
    "prompt": "a red circle",
    "category": "color",
    "spec": {
        "objects": [{"color": "red", "shape": "circle", "texture": None, "count": 1}],
        "relation": None,
        "exact_count": False,
    },
}


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "a red circle", ', "not valid JSON"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "spec"}), "keys prompt, category, spec"),
        (json.dumps(GOOD | {"category": "3d_spatial"}), "unknown category"),
        (json.dumps(GOOD | {"prompt": "a_red circle"}), "without '_'"),
        (
            json.dumps(
                GOOD
                | {
                    "spec": {
                        **GOOD["spec"],
                        "objects": [{"color": "mauve", "shape": "circle", "texture": None, "count": 1}],
                    }
                }
            ),
            "unknown color",
        ),
        (
            json.dumps(
                GOOD
                | {
                    "spec": {
                        **GOOD["spec"],
                        "objects": [{"color": None, "shape": "hexagon", "texture": None, "count": 1}],
                    }
                }
            ),
            "unknown shape",
        ),
        (
            json.dumps(
                GOOD
                | {
                    "spec": {
                        **GOOD["spec"],
                        "objects": [{"color": None, "shape": "circle", "texture": "furry", "count": 1}],
                    }
                }
            ),
            "unknown texture",
        ),
        (json.dumps(GOOD), "repeats line 1"),
        ('{"prompt": "a blue circle", ' + json.dumps(GOOD)[1:], "key 'prompt' is given twice"),
    ],
)
def test_malformed_suite_lines_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "suite.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n")
    with pytest.raises(ValueError, match=message) as err:
        load_suite(path)
    assert f"{path}:3:" in str(err.value)


def test_make_suites_and_eval_compbench_stages(tmp_path):
    from margrpo.stages import eval_compbench, make_suites

    parser = argparse.ArgumentParser()
    make_suites.add_arguments(parser)
    out = tmp_path / "suites"
    make_suites.run(
        parser.parse_args(
            [
                "--out-dir",
                str(out),
                "--n-train",
                "12",
                "--n-val",
                "6",
                "--n-eval",
                "6",
                "--snap",
                "true",
                "--palette-size",
                "6",
            ]
        )
    )
    assert WorldConfig.from_dict(json.loads((out / "world.json").read_text())) == CFG
    records = load_suite(out / "eval.jsonl")
    assert len(records) == 6 and len(load_suite(out / "train.jsonl")) == 12

    samples = tmp_path / "run" / "samples"
    samples.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for r in records:
        Image.fromarray(render(scene_for_spec(r.spec, rng, CFG), CFG)).save(samples / f"{r.prompt}_{0:06d}.png")
        Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(samples / f"{r.prompt}_{1:06d}.png")
    parser = argparse.ArgumentParser()
    eval_compbench.add_arguments(parser)
    per_image, per_category = tmp_path / "pi.csv", tmp_path / "pc.csv"
    argv = [
        "--samples-dir",
        str(samples.parent),
        "--suite",
        str(out / "eval.jsonl"),
        "--out-per-image",
        str(per_image),
        "--out-per-category",
        str(per_category),
        "--images-per-prompt",
        "2",
    ]
    eval_compbench.run(parser.parse_args(argv))
    import pandas as pd

    table = pd.read_csv(per_category)
    assert list(table.columns) == ["category", "n_images", "strict", "lenient"]
    assert table["n_images"].tolist() == [2] * 6 and table["strict"].tolist() == [0.5] * 6

    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(samples / "a purple hexagon_000000.png")
    with pytest.raises(ValueError, match="a purple hexagon_000000.png"):
        eval_compbench.run(parser.parse_args(argv))


@pytest.fixture
def sampled(tmp_path):
    """A toy eval suite of 4 prompts and its complete samples folder, 2 images each."""
    from margrpo.stages import make_suites

    parser = argparse.ArgumentParser()
    make_suites.add_arguments(parser)
    out = tmp_path / "suites"
    make_suites.run(
        parser.parse_args(
            [
                "--out-dir",
                str(out),
                "--n-train",
                "12",
                "--n-val",
                "4",
                "--n-eval",
                "4",
                "--snap",
                "true",
                "--palette-size",
                "6",
            ]
        )
    )
    samples = tmp_path / "samples"
    samples.mkdir()
    prompts = [r.prompt for r in load_suite(out / "eval.jsonl")]
    for p in prompts:
        for i in range(2):
            Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(samples / f"{p}_{i:06d}.png")
    return out / "eval.jsonl", samples, prompts


@pytest.mark.parametrize("stage", ["eval-compbench", "eval-preference"])
def test_evaluation_reads_a_complete_sample_set_or_refuses(sampled, tmp_path, stage):
    """Issue #31.1: a deleted PNG, or an extra index at fewer images per prompt, gave a mean over other images
    (exit 0)."""
    from margrpo.cli import main

    suite, samples, prompts = sampled
    outs = (
        ["--out-per-image", str(tmp_path / "i.csv"), "--out-per-category", str(tmp_path / "c.csv")]
        if stage == "eval-compbench"
        else ["--scorers", "shapes", "--out", str(tmp_path / "p.csv")]
    )

    def run(*extra):
        return main([stage, "--samples-dir", str(samples), "--suite", str(suite), *outs, *extra])

    assert run("--images-per-prompt", "2") == 0
    first = sorted(prompts)[0]  # extra files are named in file-name order
    with pytest.raises(
        SystemExit, match=rf"{samples / (first + '_000001.png')}: extra sample: index 1 is past --images-per-prompt 1"
    ):
        run("--images-per-prompt", "1")
    with pytest.raises(
        SystemExit,
        match=rf"{samples / (prompts[3] + '_000000.png')}: extra sample: prompt .* is not among the 3 evaluated",
    ):
        run("--images-per-prompt", "2", "--max-prompts", "3")
    (samples / f"{prompts[2]}_000001.png").unlink()
    with pytest.raises(
        SystemExit,
        match=rf"{samples / (prompts[2] + '_000001.png')}: missing; the evaluation needs 2 image\(s\) of each "
        r"of the 4 prompts .* \(7 of 8 found\)",
    ):
        run("--images-per-prompt", "2")
