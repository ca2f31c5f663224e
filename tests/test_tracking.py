"""Issue #17: TensorBoard through accelerate's trackers, and the EMA of the trained parameters that
validation and the saved checkpoints use (the resumable state keeps the raw weights beside it)."""

import importlib.util
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from helpers import KillAt, make_trainer, tiny_policy
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from margrpo.grpo.checkpoints import legacy_resume_key
from margrpo.grpo.trainer import GRPOConfig
from margrpo.infra.files import spec_hash
from margrpo.policy import load_policy

REPO = Path(__file__).resolve().parents[1]
HEADER_KEYS = {
    "step",
    "rows",
    "checkpoints",
    "nonfinite_run",
    "spec_hash",
    "record",
    "format",
}  # the optimizer: train/


def events(run_dir):
    acc = EventAccumulator(str(Path(run_dir) / "tb" / "grpo"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def killed(trainer):
    """Train `trainer`, made with `hooks=KillAt(n)`: it dies as step n + 1 begins (after logging step n)."""
    with pytest.raises(pytest.fail.Exception):
        trainer.train()


def test_tensorboard_holds_every_step_scalar_and_a_validation_grid(tmp_path):
    trainer = make_trainer(tmp_path, steps=2)
    rows = trainer.train()
    acc = events(tmp_path)
    numeric = {k for k, v in rows[0].items() if k != "step" and isinstance(v, (int, float))}
    assert numeric <= set(acc.Tags()["scalars"]) and {"reward_mean", "policy_loss", "val_reward"} <= numeric
    assert [e.step for e in acc.Scalars("reward_mean")] == [1, 2]
    assert [e.value for e in acc.Scalars("reward_mean")] == pytest.approx([r["reward_mean"] for r in rows])
    assert [e.step for e in acc.Images("val/samples")] == [0, 1, 2]  # the base validation and each later one
    image = acc.Images("val/samples")[0]
    assert image.width == 2 * image.height  # the first image of the 2 validation prompts, side by side


def test_a_resumed_run_logs_no_step_twice(tmp_path):
    """save_every = 2: the killed run logged step 3 past its step-2 checkpoint; the resume logs 3 again, once."""
    killed(make_trainer(tmp_path, policy=tiny_policy("flow", seed=1), steps=4, save_every=2, hooks=KillAt(3)))
    resumed = make_trainer(tmp_path, policy=tiny_policy("flow", seed=1), steps=4, save_every=2)
    rows = resumed.train()
    acc = events(tmp_path)
    assert [e.step for e in acc.Scalars("reward_mean")] == [1, 2, 3, 4]
    assert acc.Scalars("reward_mean")[-1].value == pytest.approx(rows[-1]["reward_mean"])
    assert [e.step for e in acc.Images("val/samples")] == [0, 1, 2, 3, 4]


def test_ema_checkpoint_holds_the_average_and_validation_scores_it(tmp_path):
    trainer = make_trainer(tmp_path, steps=3, ema_decay=0.5, freeze_head=True)
    trainer.train()
    saved = load_policy(tmp_path / "state/ckpt-000003/policy").state_dict()
    raw = trainer.policy.state_dict()
    assert set(trainer.ema.shadow) == {n for n, p in trainer.policy.named_parameters() if p.requires_grad}
    for k, v in saved.items():
        if k in trainer.ema.shadow:
            assert torch.equal(v, trainer.ema.shadow[k].to(v.dtype)), k
        else:  # what RL leaves alone (here the head, +Fix) is the raw weight
            assert torch.equal(v, raw[k]), k
    assert any(not torch.equal(saved[k], raw[k]) for k in trainer.ema.shadow)  # after 3 steps the average lags
    assert trainer.validate() == trainer.checkpoints[-1]["val_scores"]  # validation ran on the EMA weights
    # the training state holds the raw weights RL goes on from, and the average
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(tmp_path / "state/ckpt-000003/train", tmp_path / "train.pt")
    state = torch.load(tmp_path / "train.pt", weights_only=False)
    assert all(torch.equal(state["policy"][k], raw[k]) for k in raw)
    assert all(torch.equal(state["ema"][k], trainer.ema.shadow[k]) for k in trainer.ema.shadow)


def test_a_killed_and_resumed_ema_run_equals_an_uninterrupted_one(tmp_path):
    full = make_trainer(tmp_path / "full", policy=tiny_policy("flow", seed=1), steps=3, ema_decay=0.5)
    rows_full = full.train()
    killed(
        make_trainer(tmp_path / "part", policy=tiny_policy("flow", seed=1), steps=3, ema_decay=0.5, hooks=KillAt(2))
    )
    resumed = make_trainer(tmp_path / "part", policy=tiny_policy("flow", seed=1), steps=3, ema_decay=0.5)
    rows = resumed.train()
    for key in ("reward_mean", "policy_loss", "grad_norm_ar", "val_reward"):
        assert rows[-1][key] == pytest.approx(rows_full[-1][key], rel=1e-6, abs=1e-9), key
    for a, b in zip(full.policy.state_dict().values(), resumed.policy.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-7)
    for k, v in full.ema.shadow.items():
        assert torch.allclose(v, resumed.ema.shadow[k], atol=1e-7), k


def test_ema_of_lora_adapters_trains_saves_and_resumes(tmp_path):
    """Issue 27.8: ema_decay with lora crashed at the first step (the EMA looked the adapters up in a state_dict
    that hides them). The EMA averages the adapters, the checkpoint holds their average, a resume goes on exactly."""

    def make(out, hooks=None):
        lora = {"rank": 4}
        return make_trainer(out, policy=tiny_policy("flow", seed=1), steps=3, ema_decay=0.5, lora=lora, hooks=hooks)

    full = make(tmp_path / "full")
    rows_full = full.train()
    adapters = {n for n, p in full.policy.named_parameters() if ".lora_" in n}
    assert adapters and set(full.ema.shadow) == adapters
    saved = dict(load_policy(tmp_path / "full/state/ckpt-000003/policy").named_parameters())
    assert all(torch.equal(saved[k], v) for k, v in full.ema.shadow.items())
    raw = dict(full.policy.named_parameters())
    assert any(not torch.equal(saved[k], raw[k]) for k in adapters)  # the average lags the raw adapters
    killed(make(tmp_path / "part", KillAt(2)))
    resumed = make(tmp_path / "part")
    rows = resumed.train()
    assert rows[-1]["val_reward"] == pytest.approx(rows_full[-1]["val_reward"], rel=1e-6, abs=1e-9)
    for (n, a), b in zip(full.policy.named_parameters(), resumed.policy.parameters()):
        assert torch.allclose(a, b, atol=1e-7), n
    for k, v in full.ema.shadow.items():
        assert torch.allclose(v, resumed.ema.shadow[k], atol=1e-7), k


def test_ema_off_and_trackers_leave_metrics_and_checkpoints_as_before(tmp_path):
    """Default settings: the state holds the keys it always held, the checkpoint the raw weights, the
    resume key is the one of states written before these settings; the trackers change no number."""
    logged = make_trainer(tmp_path / "tb", policy=tiny_policy("flow", seed=1))
    plain = make_trainer(tmp_path / "plain", policy=tiny_policy("flow", seed=1), trackers=())
    logged.train(), plain.train()
    assert (tmp_path / "tb/tb/grpo").is_dir() and not (tmp_path / "plain/tb").exists()
    state = torch.load(tmp_path / "tb/state/trainer.pt", weights_only=True)
    assert set(state) == HEADER_KEYS and logged.ema is None
    old = {
        k: v
        for k, v in {**asdict(logged.cfg), **asdict(logged.policy_settings)}.items()  # GRPOConfig's fields, once
        if k
        not in ("trackers", "ema_decay", "lora", "gradient_checkpointing", "replay_chunk", "sharding", "grad_variance")
    }
    legacy = legacy_resume_key(logged.settings(), asdict(logged.sampling), None)
    assert legacy == spec_hash({"grpo": old, "sampling": asdict(logged.sampling), "spec": None})
    flat = {f"grpo.{k}": v for k, v in old.items()} | {f"sampling.{k}": v for k, v in asdict(logged.sampling).items()}
    assert state["record"] == json.loads(json.dumps({**flat, "spec": None}))  # one entry per setting, named
    for run in (logged, plain):
        saved = load_policy(run.state_dir / "ckpt-000002/policy").state_dict()
        assert all(torch.equal(v, run.policy.state_dict()[k]) for k, v in saved.items())
    for a, b in zip(logged.policy.state_dict().values(), plain.policy.state_dict().values()):
        assert torch.equal(a, b)
    timing = ("step_time_s", "peak_mem_mb")
    assert [{k: v for k, v in r.items() if k not in timing} for r in logged.rows] == [
        {k: v for k, v in r.items() if k not in timing} for r in plain.rows
    ]


def test_tracker_and_ema_settings_are_checked():
    with pytest.raises(ValueError, match="unknown tracker 'mlflow'"):
        GRPOConfig(trackers=["mlflow"])
    with pytest.raises(ValueError, match="ema_decay"):
        GRPOConfig(ema_decay=1.0)
    if importlib.util.find_spec("wandb") is None:
        with pytest.raises(ValueError, match="'wandb' is asked for but not installed"):
            GRPOConfig(trackers=["wandb"])


def test_train_spec_leaves_the_new_keys_out_at_their_defaults():
    """Runs cached before these settings keep their Snakemake params; set ones reach the stage."""
    from margrpo.experiment.config import load_config, train_spec, validate_train_spec

    config = load_config(REPO / "config/config.yaml")
    spec = train_spec(config, "toy-nova", "toypref", "fix")
    assert "trackers" not in spec["grpo"] and "ema_decay" not in spec["grpo"]
    filled = validate_train_spec(spec)["grpo"]
    assert filled["trackers"] == ["tensorboard"] and filled["ema_decay"] is None
    config["grpo"]["ema_decay"] = 0.99
    assert train_spec(config, "toy-nova", "toypref", "fix")["grpo"]["ema_decay"] == 0.99
