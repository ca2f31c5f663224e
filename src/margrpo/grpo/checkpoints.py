"""A GRPO run's checkpoints: the policy folder and the resumable trainer state, written by the main process with
whole tensors (the engine gathers them through torch's state-dict API), so that a run resumes under any number of
processes and any sharding; a state of another spec is never resumed."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch

from margrpo.grpo.run_files import checkpoint_path, clear_written_state
from margrpo.infra.files import InputError, checked_path, space_named, spec_hash, verify_checksums
from margrpo.policy.lora import save_adapters

log = logging.getLogger("margrpo.grpo.trainer")


def save_state(trainer) -> None:
    """Checkpoint (policy folder) + resumable trainer state, written atomically by the main process. Both hold
    whole tensors (gathered through torch's state-dict API), so a run resumes under any number of processes
    and any sharding."""
    ckpt = checkpoint_path(trainer.state_dir, trainer.step)
    engine = trainer.engine
    # tensors and primitives only (loads with weights_only=True); the policy is the ckpt folder beside it
    state = {
        "step": trainer.step,
        "optimizer": engine.optimizer_state(trainer.optimizer, trainer.policy),
        "rows": trainer.rows,
        "checkpoints": trainer.checkpoints,
        "nonfinite_run": trainer.nonfinite_run,
        "spec_hash": trainer.spec_hash,
    }
    if trainer.ema:  # the raw trained weights RL goes on from, and their average
        state.update(
            raw=engine.full_tensors(trainer.ema.tracked(trainer.policy)), ema=engine.full_tensors(trainer.ema.shadow)
        )

    def write(policy: torch.nn.Module) -> None:
        with space_named(ckpt.parent):  # a full disk says so, naming the checkpoint (torch: "basic_ios::clear")
            policy.save_pretrained(ckpt)
            if trainer.policy_settings.lora:  # the base weights above are unchanged; the adapters beside them
                save_adapters(policy, ckpt)
            with checked_path(trainer.state_dir / "trainer.pt") as tmp:  # a resume checks it (bit flips load)
                torch.save(state, tmp)

    with trainer.ema.applied(trainer.policy) if trainer.ema else contextlib.nullcontext():  # selection reads the EMA
        engine.save_policy(trainer.policy, write)
    # no rank goes on before the checkpoint is on disk: a process that dies in the next step cannot take it with it
    engine.barrier()


def resume_state(trainer) -> bool:
    """Resume from state/ only if it was written under this run's spec (`trainer.spec_hash`); else clear it. The
    main process reads the files; the engine hands each process its share."""
    engine = trainer.engine
    path = trainer.state_dir / "trainer.pt"
    state, why = _read_state(trainer) if engine.is_main else ({}, "")
    header = engine.from_main({k: v for k, v in state.items() if k not in ("optimizer", "raw", "ema")} | {"why": why})
    if not header["why"] and not header.get("spec_hash"):  # nothing written yet
        return False
    if header.get("spec_hash") != trainer.spec_hash:
        log.info("not resuming from %s: %s; starting fresh", path, header["why"])
        if engine.is_main:
            clear_written_state(trainer.state_dir)
        engine.barrier()
        return False
    ckpt = checkpoint_path(trainer.state_dir, header["step"])  # found beside trainer.pt wherever it is now
    # the optimizer after the weights: torch's loader may take an empty step to create the state, which the
    # EMA's hook would see
    engine.load_policy_state(trainer.policy, _checkpoint_policy(ckpt) if engine.is_main else None)
    engine.load_optimizer_state(trainer.optimizer, trainer.policy, state.get("optimizer"))
    if trainer.ema:  # the folder holds the EMA of the trained parameters; RL goes on from the raw ones
        like = trainer.ema.tracked(trainer.policy)
        trainer.ema.assign(trainer.policy, engine.shard_like(engine.from_main(state.get("raw")), like))
        shadow = engine.shard_like(engine.from_main(state.get("ema")), like)
        trainer.ema.shadow = {k: v.float() for k, v in shadow.items()}
    trainer.step, trainer.rows, trainer.checkpoints = header["step"], header["rows"], header["checkpoints"]
    trainer.nonfinite_run = header["nonfinite_run"]
    log.info("resumed from %s at step %d of %d", path, trainer.step, trainer.cfg.steps)
    return True


def _read_state(trainer) -> tuple[dict, str]:
    """trainer.pt, checked, and why it cannot be resumed from ("" when it can, or when there is none)."""
    path = trainer.state_dir / "trainer.pt"
    if not path.exists():
        return {}, ""
    try:
        verify_checksums(trainer.state_dir, ["trainer.pt"])
        state = torch.load(path, map_location="cpu", weights_only=True)
    except InputError as err:  # changed or damaged since it was written
        return {}, str(err)
    except Exception as err:  # an older or foreign state file: it cannot be trusted either
        return {}, f"it cannot be read with weights_only=True ({type(err).__name__})"
    if state.get("spec_hash") != trainer.spec_hash:
        return state, f"it holds a run of another spec ({state.get('spec_hash')}; this run: {trainer.spec_hash})"
    return state, ""


def _checkpoint_policy(ckpt: Path) -> torch.nn.Module:
    """The policy of a checkpoint folder, whole, with its LoRA adapters, on the CPU."""
    from margrpo.policy import load_policy  # the policy registry imports every model family

    return load_policy(ckpt)


def resume_key(settings: dict, sampling: dict, spec: dict | None) -> str:
    """The hash a resumable state must match: the trainer's settings (GRPO and policy, flat) and sampling, plus
    the stage's `spec` (inputs, reward, seed). The trackers and the sharding change no result, and switches that
    are off (EMA, LoRA, checkpointing, replay_chunk) change none either: none counts, so states written before
    those switches existed still resume (and a run resumes under another sharding)."""
    off = {"ema_decay": None, "lora": None, "gradient_checkpointing": False, "replay_chunk": None}

    def quiet(g: dict) -> dict:
        return {k: v for k, v in g.items() if k not in ("trackers", "sharding") and not (k in off and v == off[k])}

    if spec and "grpo" in spec:  # the policy's settings count as they did inside the grpo section
        grpo = quiet({**spec["grpo"], **spec.get("policy", {})})
        spec = {**{k: v for k, v in spec.items() if k != "policy"}, "grpo": grpo}
    return spec_hash({"grpo": quiet(settings), "sampling": sampling, "spec": spec})
