"""The training loop of the related methods (plain GRPO / MaskGRPO on toy-mask, MARVAL-RL).

Each method supplies three callables; this loop owns the schedule and the run's files, which are
exactly those of `margrpo train` (grpo.run_files), so `select`, `sample`, `evaluate` and `report`
read a related run unchanged:

- `step_fn(i)` runs step i (0-based) and returns its metrics row (`step` = i + 1, `reward_mean`, ...);
- `validate_fn()` returns one reward per validation prompt, from fixed noise (common random numbers);
- `save_fn(path, state)` writes the policy folder `path` (RUN/state/ckpt-XXXXXX/policy) and, if the
  method resumes, whatever it needs beside it; `state` is the loop's state after the checkpoint is listed.

Validation runs at step 0 (the base policy: `base_val_*`), every `val_every` steps and at the last step;
every validation after step 0 saves a checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from tqdm.auto import tqdm

from margrpo.grpo.run_files import RunState, checkpoint_path

StepFn = Callable[[int], dict]
ValidateFn = Callable[[], list]
SaveFn = Callable[[Path, RunState], None]


def _mean(scores: list[float]) -> float:
    return sum(scores) / len(scores) if scores else float("nan")


def train_loop(
    steps: int,
    val_every: int,
    step_fn: StepFn,
    validate_fn: ValidateFn,
    save_fn: SaveFn,
    state_dir: str | Path,
    state: RunState | None = None,
    desc: str = "related",
) -> RunState:
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
            state.checkpoints.append(
                {"step": state.step, "val_reward": row["val_reward"], "val_scores": scores, "path": str(path)}
            )
            save_fn(path, state)
        bar.update(1)
        bar.set_postfix(
            reward=f"{row.get('reward_mean', math.nan):.3f}", val=f"{row['val_reward']:.3f}", refresh=False
        )
    bar.close()
    return state
