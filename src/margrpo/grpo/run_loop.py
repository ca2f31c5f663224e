"""The training loop of the related methods (plain GRPO / MaskGRPO on toy-mask, MARVAL-RL), and its outputs.

Each method supplies three callables; this loop owns the schedule and the run's files, which are
exactly those of `margrpo train` (grpo/trainer.py `write_outputs`), so `select`, `sample`, `evaluate`
and `report` read a related run unchanged:

- `step_fn(i)` runs step i (0-based) and returns its metrics row (`step` = i + 1, `reward_mean`, ...);
- `validate_fn()` returns one reward per validation prompt, from fixed noise (common random numbers);
- `save_fn(path, state)` writes the policy folder `path` (RUN/state/ckpt-XXXXXX/policy) and, if the
  method resumes, whatever it needs beside it; `state` is the loop's state after the checkpoint is listed.

Validation runs at step 0 (the base policy: `base_val_*`), every `val_every` steps and at the last step;
every validation after step 0 saves a checkpoint.
"""

from __future__ import annotations

import logging
import math
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from margrpo.infra.io import CHECKSUMS, atomic_write_json, atomic_write_rows, non_finite

log = logging.getLogger(__name__)

StepFn = Callable[[int], dict]
ValidateFn = Callable[[], list]
SaveFn = Callable[[Path, "RunState"], None]


@dataclass
class RunState:
    """What the loop has done: steps run, their metrics rows, and the validations (step 0 first)."""

    step: int = 0
    rows: list[dict] = field(default_factory=list)
    checkpoints: list[dict] = field(default_factory=list)  # {step, val_reward, val_scores, path (None at step 0)}


def checkpoint_path(state_dir: str | Path, step: int) -> Path:
    """Where the policy of a checkpoint goes, as the GRPO trainer's: state/ckpt-XXXXXX/policy."""
    return Path(state_dir) / f"ckpt-{step:06d}" / "policy"


def clear_written_state(state_dir: str | Path) -> None:
    """Remove what a trainer's save writes in state/ (trainer.pt, checksums.json, ckpt-<step>/ and their temporary
    files), nothing else: a fresh start never deletes a file it did not write."""
    for p in Path(state_dir).iterdir():
        name = p.name.lstrip(".")  # atomic writers' temporary names: .<name>.<random>.tmp...
        owned = (p.name in ("trainer.pt", CHECKSUMS) or re.fullmatch(r"ckpt-\d{6}", p.name)
                 or (p.name.startswith(".") and name.split(".", 1)[0] in ("trainer", "checksums")))
        if owned and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif owned:
            p.unlink()
        else:
            log.info("keeping %s: not written by this trainer", p)


def _mean(scores: list[float]) -> float:
    return sum(scores) / len(scores) if scores else float("nan")


def train_loop(steps: int, val_every: int, step_fn: StepFn, validate_fn: ValidateFn, save_fn: SaveFn,
               state_dir: str | Path, state: RunState | None = None, desc: str = "related") -> RunState:
    """Run to `steps` from `state` (a resumed run) or from scratch; returns the final state."""
    state = state or RunState()
    if not state.checkpoints:  # the base policy, before any update
        scores = validate_fn()
        state.checkpoints = [{"step": 0, "val_reward": _mean(scores), "val_scores": scores, "path": None}]
    bar = tqdm(total=steps, initial=state.step, desc=desc, mininterval=5)
    while state.step < steps:
        row = step_fn(state.step)
        state.step += 1
        row["step"] = state.step
        due = state.step % val_every == 0 or state.step == steps
        scores = validate_fn() if due else None
        row["val_reward"] = float("nan") if scores is None else _mean(scores)
        state.rows.append(row)
        if scores is not None:
            path = checkpoint_path(state_dir, state.step)
            state.checkpoints.append({"step": state.step, "val_reward": row["val_reward"], "val_scores": scores, "path": str(path)})
            save_fn(path, state)
        bar.update(1)
        bar.set_postfix(reward=f"{row.get('reward_mean', math.nan):.3f}", val=f"{row['val_reward']:.3f}", refresh=False)
    bar.close()
    return state


def write_run_outputs(out_dir: str | Path, state: RunState, variant: str, spec: dict, config: dict) -> dict:
    """metrics.csv (one row per step) and summary.json, atomically; returns the summary. Every RL run writes
    these two files, in this format (the GRPO trainer too): select, evaluate and report read them."""
    out = Path(out_dir)
    atomic_write_rows(out / "metrics.csv", state.rows)
    base = next((c for c in state.checkpoints if c["step"] == 0), {"val_reward": float("nan"), "val_scores": None})
    summary = {"run_dir": str(out), "variant": variant, "steps": state.step,
               "checkpoints": [c for c in state.checkpoints if c["step"] > 0], "base_val_reward": base["val_reward"],
               "base_val_scores": base["val_scores"], "spec": spec, "config": config}
    bad = non_finite(summary)  # strict JSON: null in their place, and why
    atomic_write_json(out / "summary.json", {**summary, **({"non_finite": bad} if bad else {})}, indent=1)
    return summary
