"""Issue 27.5 / 27.7: results carry their own checks. Every weights and config file a stage writes has its sha256
in checksums.json, verified on load; selection and tables agree or refuse; damaged files are one line naming them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import flip_last_byte, make_trainer, tiny_policy, tiny_toyclip

from margrpo.infra.files import InputError
from margrpo.policy import load_policy
from margrpo.reporting.results import load_metrics, load_summary

MARGRPO = str(Path(sys.executable).with_name("margrpo"))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished GRPO run with LoRA adapters: metrics.csv, summary.json, state/ (2 checkpoints)."""
    out = tmp_path_factory.mktemp("run")
    trainer = make_trainer(out, lora={"rank": 4})
    trainer.train()
    trainer.write_outputs({"variant": {"name": "grpo"}})
    return out


def copy_run(run, tmp_path):
    subprocess.run(["cp", "-r", str(run), str(tmp_path / "run")], check=True)
    return tmp_path / "run"


@pytest.mark.parametrize("name", ["model.safetensors", "adapter_model.safetensors", "tokenizer/tokenizer.json"])
def test_a_bit_flip_in_a_checkpoint_names_the_file(run, tmp_path, name):
    policy = copy_run(run, tmp_path) / "state/ckpt-000002/policy"
    load_policy(policy)
    flip_last_byte(policy / name)  # the last byte of the tensor data: loads silently without the check
    with pytest.raises(InputError, match=f"{policy / name}: sha256 differs"):
        load_policy(policy)


@pytest.mark.parametrize(
    "key,value", [("head_prediction", "eps"), ("token_norm", [0.1, 0.9]), ("head_sampler", "one_step")]
)
def test_an_edited_config_json_names_the_file(tmp_path, key, value):
    tiny_policy().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, key: value}))  # valid, loads and changes every image
    with pytest.raises(InputError, match=f"{tmp_path / 'config.json'}: sha256 differs"):
        load_policy(tmp_path)


def test_a_config_json_that_does_not_match_its_weights_names_both(tmp_path):
    """Past the checksums (a config re-recorded with its edit), the weights are still checked against the config:
    one line."""
    from margrpo.infra.files import record_checksums

    tiny_policy().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "width": 48, "heads": 4}))
    record_checksums(tmp_path, ["config.json"])
    with pytest.raises(
        InputError,
        match=rf"{tmp_path / 'model.safetensors'}: does not match {tmp_path / 'config.json'}: "
        r"shape \(file vs config\)",
    ):
        load_policy(tmp_path)


def test_a_folder_margrpo_writes_loads_only_with_its_manifest(run, tmp_path, logged):
    """Issue #31.3: a policy folder without checksums.json loaded unchecked (a bit flip or an edited config.json
    sampled without a word). Every loader of a folder margrpo writes requires the manifest: policies, checkpoints
    and their adapters, toyclip-format scorers and trainer states (which then start fresh)."""
    from margrpo.rewards.toyclip import ToyClip

    policy = copy_run(run, tmp_path) / "state/ckpt-000002/policy"
    sums = json.loads((policy / "checksums.json").read_text())
    (policy / "checksums.json").write_text(json.dumps({k: v for k, v in sums.items() if not k.startswith("adapter_")}))
    with pytest.raises(
        InputError, match=f"{policy / 'adapter_model.safetensors'}: not listed in {policy / 'checksums.json'}"
    ):
        load_policy(policy)
    (policy / "checksums.json").unlink()
    flip_last_byte(policy / "model.safetensors")
    with pytest.raises(InputError, match=f"{policy}: no checksums.json; margrpo writes one beside every folder"):
        load_policy(policy)

    clip = tmp_path / "toyclip"
    tiny_toyclip().save_pretrained(clip)
    ToyClip.from_pretrained(clip)
    (clip / "checksums.json").unlink()
    with pytest.raises(InputError, match=f"{clip}: no checksums.json"):
        ToyClip.from_pretrained(clip)

    out = tmp_path / "run"
    (out / "state/checksums.json").unlink()  # trainer.pt without its record: not read; its checkpoint's copy is
    logged()
    assert make_trainer(out, lora={"rank": 4}).try_resume()
    log = logged()
    assert f"{out / 'state'}: no checksums.json" in log and "the newest checkpoint whose training state" in log


def test_checkpoints_follow_the_umask(run):
    expected = 0o666 & ~_umask()
    files = [p for p in (run / "state").rglob("*") if p.is_file()]
    assert any(p.name.endswith(".safetensors") for p in files)
    assert {p.relative_to(run).as_posix(): oct(p.stat().st_mode & 0o777) for p in files} == {
        p.relative_to(run).as_posix(): oct(expected) for p in files
    }


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_changed_trainer_state_is_not_read_and_its_checkpoint_resumes(run, tmp_path, logged):
    out = copy_run(run, tmp_path)
    flip_last_byte(out / "state/trainer.pt")
    again = make_trainer(out, lora={"rank": 4})
    logged()
    assert again.try_resume() and again.step == 2  # from ckpt-000002/train's copy of the header (issue 59)
    assert f"{out / 'state/trainer.pt'}: sha256 differs" in logged()


def test_a_restart_moves_aside_only_the_files_the_trainer_wrote(run, tmp_path):
    """Issue #31.5: starting fresh cleared the whole state/, files the user put there included; issue 59: nothing
    the trainer wrote is deleted either, it is moved aside."""
    out = copy_run(run, tmp_path)
    (out / "state/notes.txt").write_text("mine")
    (out / "state/ckpt-old").mkdir()
    (out / "state/.trainer.pt.abc.tmp.pt").write_bytes(b"torn")  # a killed write's temporary file
    flip_last_byte(out / "state/trainer.pt")
    flip_last_byte(out / "state/ckpt-000002/train/.metadata")  # and no checkpoint to fall back to
    with pytest.raises(InputError, match="cannot be resumed"):
        make_trainer(out, lora={"rank": 4}).try_resume()
    assert not make_trainer(out, lora={"rank": 4}).try_resume(restart=True)
    assert sorted(p.name for p in (out / "state").iterdir()) == ["ckpt-old", "notes.txt"]
    (aside,) = out.glob("aside-*")
    assert sorted(p.name for p in (aside / "state").iterdir()) == [
        "checksums.json",
        "ckpt-000001",
        "ckpt-000002",
        "trainer.pt",
    ]


def test_a_symlinked_state_folder_is_refused_not_cleared(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("precious")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "state").symlink_to(elsewhere)
    with pytest.raises(InputError, match=f"{tmp_path / 'run' / 'state'}: is a symbolic link"):
        make_trainer(tmp_path / "run").train()
    assert (elsewhere / "keep.txt").read_text() == "precious"


def test_an_edited_summary_cannot_move_selection(run, tmp_path):
    out = copy_run(run, tmp_path)
    summary = json.loads((out / "summary.json").read_text())
    summary["checkpoints"][0]["val_reward"] += 1.0  # would make step 1 the best
    (out / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(InputError, match=r"summary.json: checkpoint step 1 has val_reward .* but .*metrics.csv says"):
        load_summary(tmp_path, "run")
    cli = subprocess.run(
        [
            MARGRPO,
            "select",
            "--summary",
            str(out / "summary.json"),
            "--step",
            "best",
            "--out",
            str(tmp_path / "selection.json"),
        ],
        capture_output=True,
        text=True,
    )
    assert cli.returncode != 0 and not (tmp_path / "selection.json").exists()
    assert "one of the two was edited" in cli.stderr and "Traceback" not in cli.stderr


def test_a_metrics_csv_cut_mid_line_names_the_line(run, tmp_path):
    out = copy_run(run, tmp_path)
    text = (out / "metrics.csv").read_text()
    assert len(text.splitlines()) == 3
    (out / "metrics.csv").write_text(text[: -len(text.splitlines()[-1]) // 2])  # the last row cut halfway
    with pytest.raises(InputError, match=r"metrics.csv:3: the last row is cut mid-line"):
        load_metrics(tmp_path, "run")


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("metrics.csv", "", "empty"),
        ("metrics.csv", "step,val_reward\n1,0.5,7\n", r":2: 3 fields where the header has 2"),
        ("summary.json", "", "not valid JSON"),
        ("summary.json", "[1, 2]", "expected a JSON object"),
        ("summary.json", "{}", "no checkpoints list"),
    ],
)
def test_empty_or_invalid_run_files_are_one_line_naming_the_file(run, tmp_path, name, text, message):
    out = copy_run(run, tmp_path)
    (out / name).write_text(text)
    load = load_summary if name == "summary.json" else load_metrics
    with pytest.raises(InputError, match=f"{out / name}.*{message}"):
        load(tmp_path, "run")
    if name == "metrics.csv":  # the summary is checked against it
        with pytest.raises(InputError, match=f"{out / name}"):
            load_summary(tmp_path, "run")


def test_an_untouched_run_loads(run):
    summary = load_summary(run.parent, run.name)
    assert [c["step"] for c in summary["checkpoints"]] == [1, 2] and len(load_metrics(run.parent, run.name)) == 2
    assert torch.is_tensor(next(load_policy(run / "state/ckpt-000002/policy").parameters()))


@pytest.mark.parametrize("killed_at", ["before the move", "after the move"])
def test_state_rewritten_in_place_verifies_at_any_kill_instant(tmp_path, monkeypatch, killed_at):
    """checked_path: a kill between the file's move and its checksum's record left a run that started over (CI
    saw it)."""
    import margrpo.infra.files as mio

    state = tmp_path / "trainer.pt"
    with mio.checked_path(state) as tmp:
        tmp.write_bytes(b"step 1")
    mio.verify_checksums(tmp_path, ["trainer.pt"])

    class Killed(BaseException):
        pass

    def dies(when, real=os.replace):
        def replace(*args, **kwargs):
            if when(args[1]):
                raise Killed
            return real(*args, **kwargs)

        return replace

    if (
        killed_at == "before the move"
    ):  # the pending record is written, then the process dies before os.replace(tmp, state)
        monkeypatch.setattr(mio.os, "replace", dies(lambda dst: Path(dst) == state))
    else:  # the file is moved, then the process dies before the final record replaces the pending one
        monkeypatch.setattr(
            mio.os, "replace", dies(lambda dst: Path(dst).name == mio.CHECKSUMS and state.read_bytes() == b"step 2")
        )
    with pytest.raises(Killed), mio.checked_path(state) as tmp:
        tmp.write_bytes(b"step 2")
    monkeypatch.undo()
    assert state.read_bytes() == (b"step 1" if killed_at == "before the move" else b"step 2")
    assert len(json.loads((tmp_path / mio.CHECKSUMS).read_text())["trainer.pt"]) == 2  # both hashes accepted
    mio.verify_checksums(tmp_path, ["trainer.pt"])
    state.write_bytes(b"step 3")  # any other content is still refused
    with pytest.raises(InputError, match="sha256 differs"):
        mio.verify_checksums(tmp_path, ["trainer.pt"])


def test_a_full_disk_during_a_checkpoint_write_names_the_path(tmp_path, monkeypatch):
    """Issue #31.5: torch's writer says `basic_ios::clear` when the disk fills; the error names the file instead."""
    import errno

    import margrpo.infra.files
    from margrpo.infra.files import NoSpaceError, atomic_write_text

    def full(*args, **kwargs):
        raise RuntimeError(
            "[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0\nbasic_ios::clear: iostream error"
        )

    trainer = make_trainer(tmp_path / "run", steps=1)
    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(margrpo.infra.files, "free_bytes", lambda path: 0)
    # the first torch.save of a checkpoint is now its training state's (torch.distributed.checkpoint's writer)
    with pytest.raises(NoSpaceError, match=f"no space left on {tmp_path / 'run/state/ckpt-000001'} "):
        trainer.train()
    assert not [p for p in (tmp_path / "run/state").rglob(".*")]  # no partial file or folder left

    monkeypatch.setattr(
        margrpo.infra.files, "free_bytes", lambda path: 1 << 40
    )  # space to spare: torch's error is not ours to rename
    with pytest.raises(RuntimeError, match="basic_ios::clear") as err:
        make_trainer(tmp_path / "again", steps=1).train()
    assert not isinstance(err.value, NoSpaceError)

    def no_space(fd):  # where a full disk shows for buffered text: the flush before the rename
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(margrpo.infra.files.os, "fsync", no_space)
    with pytest.raises(NoSpaceError, match=f"no space left on {tmp_path / 'x.json'} "):
        atomic_write_text(tmp_path / "x.json", "{}")
