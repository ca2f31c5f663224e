"""User errors are one line naming the file, line or key, at the earliest stage that can see them."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_policy

from margrpo.infra.files import InputError
from margrpo.policy import load_policy
from margrpo.prompts.files import read_prompt_file
from margrpo.stages.check_weights import EXPECTED

MARGRPO = str(Path(sys.executable).with_name("margrpo"))


def test_a_non_utf8_prompt_file_names_file_and_line(tmp_path):
    path = tmp_path / "color_val.txt"
    path.write_bytes("a red ball\na gr\xfcn ball\n".encode("latin-1"))
    with pytest.raises(InputError, match=r"color_val.txt:2: not valid UTF-8 \(invalid start byte at byte 4\)"):
        read_prompt_file(path, "color")


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path):
    path = tmp_path / "color_val.txt"
    path.write_text("a red ball\na green ball\n", encoding="utf-8-sig")
    assert [r.prompt for r in read_prompt_file(path, "color")] == ["a red ball", "a green ball"]


@pytest.mark.parametrize(
    "prompt,message",
    [
        ("a red\x00ball", "contains a NUL or another control character"),
        ("a very long prompt " * 13, "is 246 bytes; sample file names ({prompt}_{index:06d}.png) allow 244"),
    ],
)
def test_a_prompt_that_cannot_name_its_sample_files_fails_at_make_suites(tmp_path, prompt, message):
    """Both used to pass make-suites and crash sampling (NUL in a path, a name over the file system's limit)."""
    path = tmp_path / "train.jsonl"
    path.write_text(
        json.dumps({"prompt": "a red ball", "task_type": "color"})
        + "\n"
        + json.dumps({"prompt": prompt, "task_type": "color"})
        + "\n"
    )
    with pytest.raises(InputError, match=r"train.jsonl:2: prompt .*" + re.escape(message)):
        read_prompt_file(path)


@pytest.mark.parametrize("text", ["", "{not json", '["a list"]'])
def test_an_invalid_config_json_in_a_policy_folder_names_its_path(tmp_path, text):
    tiny_policy().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(InputError, match=str(tmp_path / "config.json")):
        load_policy(tmp_path)


def test_check_weights_rejects_empty_or_invalid_files(tmp_path):
    """A folder of empty config.json files used to pass check-weights (and fail at the first GPU job)."""
    from margrpo.stages.check_weights import check_folder

    for name in EXPECTED["nova"]:
        target = tmp_path / name
        if name == "tokenizer":
            (target / "tokenizer.json").parent.mkdir(parents=True)
            (target / "tokenizer.json").write_text("{}")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("")
    with pytest.raises(InputError, match=f"nova weights: {tmp_path / 'model_index.json'} is empty"):
        check_folder("nova", tmp_path)
    for name in EXPECTED["nova"][:-1]:
        (tmp_path / name).write_text('{"_class_name": "NOVAPipeline"}')
    (tmp_path / "vae/config.json").write_text("{truncated")
    with pytest.raises(InputError, match=f"{tmp_path / 'vae/config.json'}: not valid JSON"):
        check_folder("nova", tmp_path)
    (tmp_path / "vae/config.json").write_text("{}")
    assert check_folder("nova", tmp_path) == tmp_path


def test_cli_user_errors_have_no_traceback(tmp_path):
    out = subprocess.run(
        [
            MARGRPO,
            "check-weights",
            "--kind",
            "nova",
            "--path",
            str(tmp_path / "none"),
            "--out",
            str(tmp_path / "p.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert (
        out.stderr.strip().startswith("margrpo check-weights: error: nova weights: folder")
        and len(out.stderr.strip().splitlines()) == 1
    )


def test_hf_hub_offline_is_forced(monkeypatch):
    from margrpo.stages._common import setup

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    setup(1, "cpu")
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_an_inherited_world_size_is_named(monkeypatch):
    """Issue #31.5: WORLD_SIZE left in the shell ends a single-process stage with one line naming it (it gave an
    accelerate traceback); `train` may run data parallel but names the launcher variables that are missing."""
    from margrpo.stages._common import setup

    for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InputError, match="WORLD_SIZE=2 asks for 2 processes, but this stage runs as one"):
        setup(1, "cpu")
    with pytest.raises(InputError, match="RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT is not set"):
        setup(1, "cpu", data_parallel=True)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert str(setup(1, "cpu")) == "cpu"


def test_the_sampling_builder_rejects_unknown_keys():
    from margrpo.experiment.config import ConfigError
    from margrpo.stages._common import sampling_config

    with pytest.raises(ConfigError, match="sampling: key 'ar_stepz': unknown key"):
        sampling_config({"ar_stepz": 4})
    assert sampling_config({"ar_steps": 4}).ar_steps == 4
