"""The related-method stages end to end through `margrpo.cli.main` on tiny models: pretrain-mask,
distill-marval, train-related (grpo-mask, maskgrpo, marval-rl), and `select` / `sample` on their outputs."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import USER_FILES, assert_user_files_kept, flip_last_byte, plant_user_files

from margrpo.cli import main
from margrpo.world import WorldConfig, prompt_vocabulary

TINY_MASK = {"width": 32, "depth": 1, "heads": 2, "text_width": 16, "text_depth": 1, "text_heads": 2}
MASK_SAMPLING = {"steps": 4, "cfg_scale": 2.0}
TEACHER_SAMPLING = {"ar_steps": 4, "diffusion_steps": 5, "cfg_scale": 2.0}
ONE_STEP_SAMPLING = {"ar_steps": 4, "diffusion_steps": 2, "cfg_scale": 1.0}
RELATED = {"steps": 2, "batch_prompts": 2, "group_size": 2, "val_every": 1, "val_prompts": 3}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """Tiny ShapesWorld suites of a snapped 64-px world (one toy-mask token per cell) and its world.json."""
    out = tmp_path_factory.mktemp("related") / "data"
    main(
        ["make-suites", "--out-dir", str(out), "--preset", "grid4", "--n-train", "12", "--n-val", "6", "--n-eval", "8"]
    )
    return out


def world(data: Path) -> dict:
    return json.loads((data / "world.json").read_text())


@pytest.fixture(scope="module")
def mask_policy(data) -> Path:
    out = data.parent / "pretrain-mask"
    entry = {
        "kind": "toy-mask",
        "model": TINY_MASK,
        "pretrain": {"steps": 3, "batch_size": 8, "warmup_steps": 1},
        "sampling": MASK_SAMPLING,
    }
    main(
        [
            "pretrain-mask",
            "--world",
            str(data / "world.json"),
            "--eval-suite",
            str(data / "eval.jsonl"),
            "--policy-json",
            json.dumps(entry),
            "--out-dir",
            str(out / "policy"),
            "--quality",
            str(out / "quality.json"),
            "--threads",
            "1",
        ]
    )
    return out / "policy"


@pytest.fixture(scope="module")
def one_step_policy(data) -> Path:
    """A tiny toy-nova teacher (its spec.json as `margrpo pretrain` writes it), distilled for 2 steps."""
    from margrpo.policy import ToyMAR, ToyMARConfig

    torch.manual_seed(0)
    teacher = ToyMAR(
        ToyMARConfig(
            head_type="flow",
            vocab=prompt_vocabulary(),
            width=32,
            depth=1,
            heads=2,
            head_width=32,
            head_depth=1,
            text_width=16,
            text_depth=1,
            text_heads=2,
        )
    )
    root = data.parent / "teacher"
    teacher.save_pretrained(root / "policy")
    (root / "spec.json").write_text(json.dumps({"policy_json": {"kind": "toy", "sampling": TEACHER_SAMPLING}}))
    out = data.parent / "marval"
    entry = {
        "kind": "toy-marval",
        "teacher": "toy-nova",
        "sampling": ONE_STEP_SAMPLING,
        "distill": {"steps": 2, "batch_prompts": 2, "rows": 16, "save_every": 1},
    }
    main(
        [
            "distill-marval",
            "--teacher",
            str(root / "policy"),
            "--suites-dir",
            str(data),
            "--policy-json",
            json.dumps(entry),
            "--out-dir",
            str(out / "policy"),
            "--quality",
            str(out / "quality.json"),
            "--threads",
            "1",
        ]
    )
    return out / "policy"


@pytest.fixture(scope="module")
def toyclip_dir(data) -> Path:
    from margrpo.rewards.toyclip import ToyClip, ToyClipConfig

    torch.manual_seed(0)
    path = data.parent / "toyclip" / "model"
    ToyClip(
        ToyClipConfig(
            image_size=64, vocab=prompt_vocabulary(), width=16, embed_dim=16, text_width=16, text_depth=1, text_heads=2
        )
    ).save_pretrained(path)
    return path


def related_spec(method: str, data: Path, weights: dict, sampling: dict, **related) -> dict:
    return {
        "method": method,
        "related": {**RELATED, **related},
        "reward": {"name": "mix", "weights": weights},
        "reward_models": {"shapes": {"world": world(data)}} if "shapes" in weights else {},
        "sampling": sampling,
        "device": "cpu",
        "mixed_precision": "no",
    }


def related_argv(method, policy, data, spec, out, toyclip=None, restart=False) -> list[str]:
    argv = [
        "train-related",
        "--method",
        method,
        "--policy-dir",
        str(policy),
        "--suites-dir",
        str(data),
        "--spec-json",
        json.dumps(spec),
        "--seed",
        "3",
        "--out-dir",
        str(out),
        "--threads",
        "1",
    ]
    return argv + (["--toyclip-dir", str(toyclip)] if toyclip else []) + (["--restart"] if restart else [])


def train_related(method, policy, data, spec, out, toyclip=None, restart=False):
    main(related_argv(method, policy, data, spec, out, toyclip, restart))


def check_run(out: Path, method: str, steps: int = 2, val_prompts: int = 3) -> dict:
    """metrics.csv and summary.json in `margrpo train`'s format, read by the reporting code and `margrpo select`."""
    import pandas as pd

    from margrpo.reporting.results import load_summary
    from margrpo.stages._related import load_any_policy

    metrics = pd.read_csv(out / "metrics.csv")
    assert metrics["step"].tolist() == list(range(1, steps + 1))
    for col in ("reward_mean", "reward_std", "step_time_s", "val_reward"):
        assert metrics[col].notna().all(), col  # val_every 1: every step validated
    summary = load_summary(out.parent, out.name)
    assert summary["variant"] == method and summary["steps"] == steps
    assert summary["spec"]["method"] == method and summary["spec"]["seed"] == 3 and summary["config"]["seed"] == 3
    assert len(summary["base_val_scores"]) == val_prompts
    assert summary["base_val_reward"] == pytest.approx(sum(summary["base_val_scores"]) / val_prompts)
    assert [c["step"] for c in summary["checkpoints"]] == list(range(1, steps + 1))
    for c, val in zip(summary["checkpoints"], metrics["val_reward"]):
        assert len(c["val_scores"]) == val_prompts and c["val_reward"] == pytest.approx(val)
        assert c["path"] == str(out / "state" / f"ckpt-{c['step']:06d}" / "policy")
        load_any_policy(c["path"])
    for step in ("best", "2"):
        main(
            [
                "select",
                "--summary",
                str(out / "summary.json"),
                "--step",
                step,
                "--out",
                str(out / f"select-{step}.json"),
            ]
        )
    selection = json.loads((out / "select-2.json").read_text())
    assert selection["step"] == 2 and selection["policy"] == summary["checkpoints"][1]["path"]
    return summary


def test_pretrain_mask_writes_a_loadable_policy_and_its_quality_report(mask_policy):
    from margrpo.infra.files import InputError
    from margrpo.policy import load_policy
    from margrpo.related.maskgrpo.policy import ToyMaskPolicy
    from margrpo.stages._related import load_any_policy

    policy = load_any_policy(mask_policy)
    with pytest.raises(InputError, match="a 'toy-mask' policy .*load_any_policy"):
        load_policy(mask_policy)  # the policy package does not import a related method: the stages dispatch
    assert isinstance(policy, ToyMaskPolicy) and policy.config.width == 32
    assert policy.world == WorldConfig.from_dict(
        json.loads((mask_policy.parents[1] / "data" / "world.json").read_text())
    )
    quality = json.loads((mask_policy.parent / "quality.json").read_text())
    assert quality["n_images"] == 8 * 2 and {"strict", "lenient", "shuffled_strict"} <= set(quality["overall"])
    assert quality["per_category"] and quality["pretrain"]["steps"] == 3
    assert (mask_policy.parent / "spec.json").is_file() and (mask_policy.parent / "state" / "log.csv").is_file()


def mask_run(method: str, mask_policy: Path, data: Path) -> tuple[Path, dict]:
    """A toy-mask run's folder and spec, trained unless this module already did: a test that compares
    with another method's run gets it whichever tests run, in whatever order (issue 27)."""
    out = data.parent / "runs" / method
    spec = related_spec(method, data, {"shapes": 1.0}, MASK_SAMPLING, iterations=2)
    if not (out / "summary.json").is_file():
        train_related(method, mask_policy, data, spec, out)
    return out, spec


@pytest.mark.parametrize("method", ["grpo-mask", "maskgrpo"])
def test_train_related_on_toy_mask_writes_the_files_of_margrpo_train(method, mask_policy, data, logged):
    out, spec = mask_run(method, mask_policy, data)
    summary = check_run(out, method)
    assert summary["config"]["method"] == {"grpo-mask": "grpo", "maskgrpo": "mask_grpo"}[method]
    # the base validation is the same draw for every method and seed: common random numbers
    first = json.loads((mask_run("grpo-mask", mask_policy, data)[0] / "summary.json").read_text())
    assert summary["base_val_scores"] == first["base_val_scores"]
    # a second run finds its state written under the same spec: it resumes at the end and rewrites the same files
    (out / "summary.json").unlink()
    logged()
    train_related(method, mask_policy, data, spec, out)
    assert "resumed from" in logged()
    again = json.loads((out / "summary.json").read_text())
    assert again["checkpoints"] == summary["checkpoints"]


def train_shard(out: Path, step: int = 2) -> Path:
    return next(p for p in (out / f"state/ckpt-{step:06d}/train").iterdir() if p.suffix == ".distcp")


@pytest.mark.parametrize("damage", ["header and shard", "shard"])
def test_a_damaged_related_state_stops_the_run_and_a_restart_moves_it_aside(
    damage, mask_policy, data, tmp_path, logged
):
    """train-related started fresh over a state it could not read (issue 59): now, as `margrpo train`, it stops
    naming the damage and deletes nothing; `--restart` moves the trainer's files aside and keeps the user's. Issue
    69: a header that reads over shards that do not verify refused again under --restart (a workflow's rerun failed
    until someone moved state/ by hand)."""
    out, spec = tmp_path / "run", related_spec("grpo-mask", data, {"shapes": 1.0}, MASK_SAMPLING, iterations=2)
    train_related("grpo-mask", mask_policy, data, spec, out)
    (out / "state/notes.txt").write_text("mine")
    (out / "state/ckpt-old").mkdir()
    flip_last_byte(train_shard(out))
    if damage == "header and shard":
        flip_last_byte(out / "state/trainer.pt")

    def files():  # the run folder's lock records its holder: not the run's
        return {p: p.read_bytes() for p in (out / "state").rglob("*") if p.is_file() and p.name != ".lock"}

    before = files()
    with pytest.raises(SystemExit, match=r"distcp: sha256 differs.*Nothing was deleted.*--restart"):
        train_related("grpo-mask", mask_policy, data, spec, out)
    assert files() == before
    (out / "state/.trainer.pt.abc.tmp.pt").write_bytes(b"torn")  # a killed write's temporary file
    logged()
    train_related("grpo-mask", mask_policy, data, spec, out, restart=True)
    assert "--restart: moved it to" in logged()
    (aside,) = out.glob("aside-*")
    assert (aside / "state/trainer.pt").read_bytes() == before[out / "state/trainer.pt"]
    assert (out / "state/notes.txt").read_text() == "mine" and (out / "state/ckpt-old").is_dir()
    assert not (out / "state/.trainer.pt.abc.tmp.pt").exists()
    assert json.loads((out / "summary.json").read_text())["checkpoints"][-1]["step"] == 2


def test_related_checkpoints_without_their_header_resume_or_are_not_overwritten(mask_policy, data, tmp_path, logged):
    """A lost trainer.pt: the run resumes from the header's copy in the newest training state (as `margrpo train`);
    with no training state either, policy folders alone are a run it cannot prove stale: it stops, overwriting
    nothing, and --restart moves them aside."""
    out, spec = tmp_path / "run", related_spec("grpo-mask", data, {"shapes": 1.0}, MASK_SAMPLING, iterations=2)
    train_related("grpo-mask", mask_policy, data, spec, out)
    (out / "state/trainer.pt").unlink()
    weights = (out / "state/ckpt-000002/policy/model.safetensors").read_bytes()
    logged()
    train_related("grpo-mask", mask_policy, data, spec, out)
    assert "ckpt-000002/train, the newest checkpoint whose training state verifies" in logged()
    assert (out / "state/ckpt-000002/policy/model.safetensors").read_bytes() == weights
    assert not (out / "state/trainer.pt").exists()  # a run resumed at its end writes nothing
    shutil.rmtree(out / "state/ckpt-000002/train")
    with pytest.raises(SystemExit, match="holds checkpoints .* but no trainer.pt.*Nothing was deleted"):
        train_related("grpo-mask", mask_policy, data, spec, out)
    assert (out / "state/ckpt-000002/policy/model.safetensors").read_bytes() == weights
    train_related("grpo-mask", mask_policy, data, spec, out, restart=True)
    (aside,) = out.glob("aside-*")
    assert (aside / "state/ckpt-000002/policy/model.safetensors").read_bytes() == weights


@pytest.mark.parametrize("method", ["grpo-mask", "marval-rl"])
def test_a_related_run_stopped_by_sigterm_resumes_to_the_uninterrupted_result(
    method, mask_policy, one_step_policy, data, toyclip_dir, tmp_path
):
    """SIGTERM (SLURM's requeue, preemption, scancel) during a step: the step ends, the state is saved, the stage
    exits 75 ("run again"), and the same command goes on to the uninterrupted run's rows and weights."""
    import signal
    import subprocess
    import sys
    import time

    if method == "marval-rl":
        policy, toyclip = one_step_policy, toyclip_dir
        spec = related_spec(method, data, {"toyclip": 1.0, "shapes": 0.5}, ONE_STEP_SAMPLING, steps=6, lr=1e-3)
    else:
        policy, toyclip = mask_policy, None
        spec = related_spec(method, data, {"shapes": 1.0}, MASK_SAMPLING, iterations=2, steps=6)
    full, cut = tmp_path / "full", tmp_path / "cut"
    train_related(method, policy, data, spec, full, toyclip)
    argv = [sys.executable, "-m", "margrpo", *related_argv(method, policy, data, spec, cut, toyclip)]
    job = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not (cut / "state/ckpt-000001/policy/checksums.json").is_file() and job.poll() is None:
        time.sleep(0.02)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=300)
    assert job.returncode == 75, err[-2000:]
    assert "SIGTERM received" in err and not (cut / "summary.json").exists()
    stopped_at = torch.load(cut / "state/trainer.pt", weights_only=True)["step"]
    assert 1 <= stopped_at < 6, stopped_at
    train_related(method, policy, data, spec, cut, toyclip)
    a, b = (json.loads((run / "summary.json").read_text()) for run in (full, cut))
    assert a["checkpoints"] == [{**c, "path": c["path"].replace(str(cut), str(full))} for c in b["checkpoints"]]
    rows = [(run / "metrics.csv").read_text().splitlines() for run in (full, cut)]
    header = rows[0][0].split(",")
    timing = [i for i, k in enumerate(header) if k in ("step_time_s", "peak_mem_mb")]
    same = [[[v for i, v in enumerate(r.split(",")) if i not in timing] for r in run] for run in rows]
    assert same[0] == same[1]
    for step in (2, 6):
        name = f"state/ckpt-{step:06d}/policy/model.safetensors"
        assert (full / name).read_bytes() == (cut / name).read_bytes(), name


class Interrupted(Exception):
    """Stands for a job killed after its first checkpoint: the next invocation of the same spec continues from it."""


def test_train_related_deletes_nothing_it_did_not_write(mask_policy, data, tmp_path, monkeypatch, logged):
    """Issue #36, as for `margrpo train` (tests/test_run_folder.py): a user's files in the run folder outlive a fresh
    start, a resume that continues and a restart under another spec; the restart still removes what the trainer
    wrote."""
    from margrpo.related.method import RelatedTrainer

    run, spec = tmp_path / "run", related_spec("grpo-mask", data, {"shapes": 1.0}, MASK_SAMPLING, iterations=2)
    plant_user_files(run)
    save = RelatedTrainer.save

    def save_then_die(self, background=False):
        save(self, background)
        self.finish_saves()  # killed once the checkpoint is on disk
        raise Interrupted

    with monkeypatch.context() as patch:
        patch.setattr(RelatedTrainer, "save", save_then_die)
        with pytest.raises(Interrupted):
            train_related("grpo-mask", mask_policy, data, spec, run)  # fresh, killed after its step-1 checkpoint
    assert (run / "state/trainer.pt").is_file() and (run / "state/ckpt-000001/policy/checksums.json").is_file()
    assert_user_files_kept(run, "fresh start")
    logged()
    train_related("grpo-mask", mask_policy, data, spec, run)  # the same spec: continues from step 1 to step 2
    assert "resumed from" in logged() and json.loads((run / "summary.json").read_text())["steps"] == 2
    assert_user_files_kept(run, "resume")
    (run / "state/.trainer.pt.x1y2z3w4.tmp.pt").write_bytes(b"torn")  # the temporary file of a killed trainer.pt write
    fewer = {**spec, "related": {**spec["related"], "steps": 1}}  # another spec: one step, where the state has two
    with pytest.raises(SystemExit, match=r"at step 2, past this run's related.steps 1. Nothing was deleted"):
        train_related("grpo-mask", mask_policy, data, fewer, run)
    assert_user_files_kept(run, "refusal")
    logged()
    train_related("grpo-mask", mask_policy, data, fewer, run, restart=True)
    assert "--restart: moved it to" in logged() and json.loads((run / "summary.json").read_text())["steps"] == 1
    assert not (run / "state/ckpt-000002").exists() and not (run / "state/.trainer.pt.x1y2z3w4.tmp.pt").exists()
    (aside,) = run.glob("aside-*")
    assert (aside / "state/ckpt-000002/policy/checksums.json").is_file()
    for name, data in USER_FILES.items():  # each where it was, or moved aside with the checkpoint it sat beside
        assert data in {p.read_bytes() for p in (run / name, aside / name) if p.is_file()}, name


def test_train_related_refuses_to_replace_a_checkpoint_folder_it_did_not_write(mask_policy, data, tmp_path):
    """Issue #36: a checkpoint's policy folder is replaced whole (atomic_dir); one there that no run wrote is
    refused."""
    run, spec = (
        tmp_path / "run",
        related_spec("grpo-mask", data, {"shapes": 1.0}, MASK_SAMPLING, iterations=2, steps=1),
    )
    (run / "state/ckpt-000001/policy").mkdir(parents=True)
    (run / "state/ckpt-000001/policy/notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match=f"{run / 'state/ckpt-000001/policy'}: not a checkpoint margrpo wrote"):
        train_related("grpo-mask", mask_policy, data, spec, run)
    assert (run / "state/ckpt-000001/policy/notes.txt").read_text() == "mine"


@pytest.mark.parametrize("refused", ["other settings", "fewer steps", "a second writer"])
def test_a_refused_related_run_leaves_spec_json_as_it_was(refused, mask_policy, data, tmp_path):
    """Issue 69: a refused run rewrote <run>/spec.json with settings it never ran under (written before the lock and
    the resume decision); now spec.json is written once the lock is held and the state accepted."""
    from margrpo.infra.run_lock import hold_run_folder

    out, spec = tmp_path / "run", related_spec("grpo-mask", data, {"shapes": 1.0}, MASK_SAMPLING, iterations=2)
    train_related("grpo-mask", mask_policy, data, spec, out)
    written = (out / "spec.json").read_bytes()
    other = {
        "other settings": {**spec, "related": {**spec["related"], "lr": 2e-4}},
        "fewer steps": {**spec, "related": {**spec["related"], "steps": 1}},
        "a second writer": {**spec, "related": {**spec["related"], "lr": 2e-4}},  # refused before it reads them
    }[refused]
    with pytest.raises(SystemExit, match="Nothing was deleted|another train job writes this run folder"):
        if refused == "a second writer":
            with hold_run_folder(out / "state"):  # flock: a second open file of this process is refused alike
                train_related("grpo-mask", mask_policy, data, other, out)
        else:
            train_related("grpo-mask", mask_policy, data, other, out)
    assert (out / "spec.json").read_bytes() == written


def test_a_full_disk_while_the_policy_weights_are_written_is_a_one_line_error(
    mask_policy, data, tmp_path, monkeypatch
):
    """Issue 69: safetensors' writer (Rust) reports a full disk as its own SafetensorError (the errno in its text
    alone), which ended in its traceback; now it is the one-line error the training state's writes give."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):  # what safetensors raises when write(2) fails with ENOSPC
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.torch, "serialize_file", full)
    out, spec = tmp_path / "run", related_spec("grpo-mask", data, {"shapes": 1.0}, MASK_SAMPLING, iterations=2)
    with pytest.raises(SystemExit, match=r"error: no space left on .*ckpt-000001/.*free space on its filesystem"):
        train_related("grpo-mask", mask_policy, data, spec, out)
    assert not (out / "state/ckpt-000001/policy").exists()


def test_distill_marval_writes_a_one_step_policy_and_marval_rl_trains_it(one_step_policy, data, toyclip_dir):
    from margrpo.policy import ToyMAR, load_policy

    student = load_policy(one_step_policy)
    assert isinstance(student, ToyMAR) and student.config.head_sampler == "one_step"
    quality = json.loads((one_step_policy.parent / "quality.json").read_text())
    assert quality["n_images"] == 8 * 2 and quality["distill"]["steps"] == 2 and quality["teacher"] == "toy-nova"
    out = data.parent / "runs" / "marval-rl"
    spec = related_spec("marval-rl", data, {"toyclip": 1.0, "shapes": 0.5}, ONE_STEP_SAMPLING, lr=1e-3)
    train_related("marval-rl", one_step_policy, data, spec, out, toyclip_dir)
    summary = check_run(out, "marval-rl")
    assert summary["config"]["toyclip_weight"] == 1.0 and summary["config"]["shapes_weight"] == 0.5
    metrics = __import__("pandas").read_csv(out / "metrics.csv")
    assert {"reward/toyclip", "reward/shapes", "grad_norm"} <= set(metrics.columns)


def _pngs(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.png"))}


def test_sample_on_a_toy_mask_policy_and_a_one_step_policy(mask_policy, one_step_policy, data):
    from margrpo.prompts.suites import load_suite

    prompts = [r.prompt for r in load_suite(data / "eval.jsonl")[:3]]
    runs = {}
    for name, policy, sampling in (
        ("mask", mask_policy, MASK_SAMPLING),
        ("mask-again", mask_policy, MASK_SAMPLING),
        ("one-step", one_step_policy, ONE_STEP_SAMPLING),
    ):
        out = data.parent / "samples" / name
        main(
            [
                "sample",
                "--policy",
                str(policy),
                "--suite",
                str(data / "eval.jsonl"),
                "--sampling-json",
                json.dumps(sampling),
                "--images-per-prompt",
                "2",
                "--max-prompts",
                "3",
                "--seed",
                "5",
                "--out-dir",
                str(out),
                "--threads",
                "1",
            ]
        )
        runs[name] = _pngs(out)
        assert sorted(runs[name]) == sorted(f"{p}_{i:06d}.png" for p in prompts for i in range(2))
    assert runs["mask"] == runs["mask-again"]  # deterministic from --seed


@pytest.mark.parametrize(
    "stage, bad",
    [
        ("train-related", {"spec": {"bogus_key": 1}}),
        ("train-related", {"related": {"bogus_key": 1}}),
        ("train-related", {"sampling": {"bogus_key": 1}}),
        ("pretrain-mask", {"entry": {"bogus_key": 1}}),
        ("pretrain-mask", {"model": {"bogus_key": 1}}),
        ("distill-marval", {"distill": {"bogus_key": 1}}),
    ],
)
def test_an_unknown_key_is_a_one_line_error_naming_it(stage, bad, data, tmp_path):
    if stage == "train-related":
        spec = related_spec(
            "grpo-mask", data, {"shapes": 1.0}, {**MASK_SAMPLING, **bad.get("sampling", {})}, **bad.get("related", {})
        )
        argv = [
            "train-related",
            "--method",
            "grpo-mask",
            "--policy-dir",
            str(tmp_path / "none"),
            "--suites-dir",
            str(data),
            "--spec-json",
            json.dumps({**spec, **bad.get("spec", {})}),
            "--out-dir",
            str(tmp_path / "run"),
        ]
    elif stage == "pretrain-mask":
        entry = {"kind": "toy-mask", "model": {**TINY_MASK, **bad.get("model", {})}, **bad.get("entry", {})}
        argv = [
            "pretrain-mask",
            "--world",
            str(data / "world.json"),
            "--eval-suite",
            str(data / "eval.jsonl"),
            "--policy-json",
            json.dumps(entry),
            "--out-dir",
            str(tmp_path / "p" / "policy"),
            "--quality",
            str(tmp_path / "q.json"),
        ]
    else:
        entry = {"kind": "toy-marval", "teacher": "t", "distill": bad["distill"], "sampling": ONE_STEP_SAMPLING}
        argv = [
            "distill-marval",
            "--teacher",
            str(tmp_path / "t" / "policy"),
            "--suites-dir",
            str(data),
            "--policy-json",
            json.dumps(entry),
            "--out-dir",
            str(tmp_path / "d" / "policy"),
            "--quality",
            str(tmp_path / "q.json"),
        ]
    with pytest.raises(SystemExit) as err:
        main(argv)
    message = str(err.value)
    assert "bogus_key" in message and "\n" not in message and message.startswith(f"margrpo {stage}: error:")


def test_a_method_on_the_wrong_policy_or_reward_is_a_one_line_error(
    mask_policy, one_step_policy, data, toyclip_dir, tmp_path
):
    cases = [
        (
            "grpo-mask",
            one_step_policy,
            related_spec("grpo-mask", data, {"shapes": 1.0}, MASK_SAMPLING),
            "toy-mask policy",
        ),
        (
            "marval-rl",
            mask_policy,
            related_spec("marval-rl", data, {"toyclip": 1.0}, ONE_STEP_SAMPLING),
            "one-step policy",
        ),
        (
            "marval-rl",
            one_step_policy,
            related_spec("marval-rl", data, {"shapes": 1.0}, ONE_STEP_SAMPLING),
            "toyclip weight",
        ),
        (
            "maskgrpo",
            mask_policy,
            related_spec("grpo-mask", data, {"shapes": 1.0}, MASK_SAMPLING),
            "disagrees with --method",
        ),
    ]
    for method, policy, spec, words in cases:
        with pytest.raises(SystemExit) as err:
            train_related(method, policy, data, spec, tmp_path / method, toyclip=toyclip_dir)
        assert words in str(err.value) and "\n" not in str(err.value), str(err.value)
