"""The related methods' side of the run loop (plain GRPO / MaskGRPO on toy-mask, MARVAL-RL).

Each method supplies three callables; the run loop every RL run shares (grpo.run_loop) owns the schedule, and the
run's files are exactly those of `margrpo train` (grpo.run_files), so `select`, `sample`, `evaluate` and `report`
read a related run unchanged:

- `step_fn(i)` runs step i (0-based) and returns its metrics row (`step` = i + 1, `reward_mean`, ...);
- `validate_fn()` returns one reward per validation prompt, from fixed noise (common random numbers);
- `save_fn(path, state)` writes the policy folder `path` (RUN/state/ckpt-XXXXXX/policy) and, if the
  method resumes, whatever it needs beside it; `state` is the loop's state after the checkpoint is listed.

Validation runs at step 0 (the base policy: `base_val_*`), every `val_every` steps and at the last step;
every validation after step 0 saves a checkpoint (listed for selection where its reward is finite).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from margrpo.grpo.run_files import RunState, checkpoint_path
from margrpo.grpo.run_loop import Cadence, run_loop

StepFn = Callable[[int], dict]
ValidateFn = Callable[[], list]
SaveFn = Callable[[Path, RunState], None]


@dataclass
class _Functions:
    """A related method's three callables as the run loop's method (grpo.run_loop.Method)."""

    step_fn: StepFn
    validate_fn: ValidateFn
    save_fn: SaveFn
    state: RunState
    state_dir: Path

    def train_step(self) -> dict:
        row = self.step_fn(self.state.step)
        self.state.step += 1
        row["step"] = self.state.step
        return row

    def validate(self) -> list:
        return self.validate_fn()

    def save(self) -> None:
        self.save_fn(checkpoint_path(self.state_dir, self.state.step), self.state)

    def log(self, row: dict) -> None:  # the related runs keep no trackers
        pass

    def should_stop(self, next_seconds: float) -> None:
        return None


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
    """Run to `steps` from `state` (a resumed run) or from scratch, in the run loop every RL run shares
    (grpo.run_loop: a checkpoint at each validation); returns the final state."""
    state = state or RunState()
    run_loop(_Functions(step_fn, validate_fn, save_fn, state, Path(state_dir)), state, Cadence(steps, val_every), desc)
    return state
