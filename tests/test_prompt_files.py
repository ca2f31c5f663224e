"""Real-scale prompt suites from files: disjoint splits, clear errors, the shipped prompt data."""

import json
from pathlib import Path

import pytest

from margrpo.prompts.files import COMPBENCH_DIR, RL_PROMPTS, build_file_suites, read_prompt_file
from margrpo.prompts.suites import load_suite, write_suite


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture
def files(tmp_path):
    rl = [
        json.dumps({"prompt": f"a red ball number {i}", "task_type": t, "nouns": ["ball"]})
        for i, t in enumerate(["color", "non", "spatial"] * 6)
    ]
    rl.append(json.dumps({"prompt": "a blue cube", "task_type": "shape"}))  # also an evaluation prompt
    train = _write(tmp_path / "train.jsonl", rl)
    bench = tmp_path / "bench"
    bench.mkdir()
    _write(bench / "color_val.txt", ["a green apple", "a yellow car"])
    _write(bench / "shape_val.txt", ["a blue cube", "a round table"])
    return train, bench


def test_suites_are_disjoint_and_validation_spans_the_task_types(files):
    train, bench = files
    suites = build_file_suites(train, bench, ["color", "shape"], n_val=3, seed=0)
    prompts = {k: {r.prompt for r in v} for k, v in suites.items()}
    assert (
        not prompts["train"] & prompts["val"]
        and not prompts["train"] & prompts["eval"]
        and not prompts["val"] & prompts["eval"]
    )
    assert "a blue cube" in prompts["eval"] and "a blue cube" not in prompts["train"]
    assert sorted(r.category for r in suites["val"]) == ["color", "non_spatial", "spatial"]
    assert len(suites["train"]) == 18 - 3 and [r.category for r in suites["eval"]] == [
        "color",
        "color",
        "shape",
        "shape",
    ]
    assert suites["val"] == build_file_suites(train, bench, ["color", "shape"], n_val=3, seed=0)["val"]  # seeded


def test_written_suites_load_back(files, tmp_path):
    train, bench = files
    for split, records in build_file_suites(train, bench, ["color", "shape"], n_val=2).items():
        write_suite(records, tmp_path / f"{split}.jsonl")
        assert load_suite(tmp_path / f"{split}.jsonl") == records


def test_bad_lines_name_the_file_and_line(tmp_path):
    bad = _write(tmp_path / "p.jsonl", [json.dumps({"prompt": "ok"}), "{not json"])
    with pytest.raises(ValueError, match=r"p.jsonl:2: not valid JSON"):
        read_prompt_file(bad, "object")
    under = _write(tmp_path / "u.txt", ["a cat", "a dog_house"])
    with pytest.raises(ValueError, match=r"u.txt:2: .*contains '_'"):
        read_prompt_file(under, "color")
    task = _write(tmp_path / "t.jsonl", [json.dumps({"prompt": "x", "task_type": "dance"})])
    with pytest.raises(ValueError, match=r"t.jsonl:1: unknown task_type 'dance'"):
        read_prompt_file(task)


def test_missing_split_and_overlapping_val_file_fail_clearly(files, tmp_path):
    train, bench = files
    with pytest.raises(FileNotFoundError, match=r"texture_val.txt not found"):
        build_file_suites(train, bench, ["texture"], n_val=2)
    val = _write(tmp_path / "color_val_extra.txt", ["a yellow car"])
    with pytest.raises(ValueError, match="also training or evaluation prompts"):
        build_file_suites(train, bench, ["color"], n_val=2, val_file=val)


def test_the_papers_prompt_files():
    suites = build_file_suites(
        RL_PROMPTS,
        COMPBENCH_DIR,
        ["color", "shape", "texture", "spatial", "numeracy", "complex"],
        n_val=96,
        seed=0,
        n_eval=300,
    )
    assert len(suites["eval"]) == 1800 and len(suites["val"]) == 96 and len(suites["train"]) > 7000
    assert not {r.prompt for r in suites["train"]} & {r.prompt for r in suites["eval"]}


def test_a_txt_train_file_takes_its_category_from_its_name(files, tmp_path):
    """Issue 27: a .txt train file (which the schema allows) could never be given its category."""
    _, bench = files
    for name, category in (("color_train.txt", "color"), ("prompts.txt", "object")):
        train = _write(tmp_path / name, [f"a red ball number {i}" for i in range(6)])
        suites = build_file_suites(train, bench, ["color"], n_val=2)
        assert {r.category for r in suites["train"] + suites["val"]} == {category}
