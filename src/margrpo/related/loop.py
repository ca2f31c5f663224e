"""The related methods' side of the run loop (plain GRPO / MaskGRPO on toy-mask, MARVAL-RL).

Each method supplies its step and its validation; the run loop every RL run shares (grpo.run_loop) owns the
schedule, the progress bar and stop requests. `RelatedMethod` is that loop's `Method` for them, in memory
(`train_mask_grpo`, `MARVALRL.train`: no checkpoints) and in the stage (`margrpo train-related`: a `save_fn` that
writes the run's files exactly as `margrpo train` does, so `select`, `sample`, `evaluate` and `report` read a
related run unchanged):

- `step_fn(i)` runs step i (0-based) and returns its metrics row (`reward_mean`, ...); the loop numbers it i + 1;
- `validate_fn()` returns one reward per validation prompt, from fixed noise (common random numbers);
- `save_fn(path, state)` writes the policy folder `path` (RUN/state/ckpt-XXXXXX/policy) and whatever a resume
  needs beside it; `state` is the loop's state after the checkpoint is listed.

Validation runs at step 0 (the base policy: `base_val_*`), every `val_every` steps and at the last step; each
validation after step 0 saves a checkpoint (listed for selection where its reward is finite).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from margrpo.grpo.run_files import RunState, checkpoint_path
from margrpo.grpo.run_loop import Cadence, run_loop
from margrpo.infra.stopping import StopRequest

log = logging.getLogger(__name__)
StepFn = Callable[[int], dict]
ValidateFn = Callable[[], list]
SaveFn = Callable[[Path, RunState], None]


@dataclass
class RelatedMethod:
    """A related method's step and validation as the run loop's `Method`; `save_fn` None: a run in memory."""

    step_fn: StepFn
    validate_fn: ValidateFn
    state: RunState
    save_fn: SaveFn | None = None
    state_dir: Path | None = None
    stop: StopRequest | None = None  # a stage run's: SLURM's time limit and signals
    steps: int = 0  # the run's length, for the stop's log line

    def train_step(self) -> dict:
        row = self.step_fn(self.state.step)
        self.state.step += 1
        return {**row, "step": self.state.step}

    def validate(self) -> list:
        return self.validate_fn()

    def save(self) -> None:
        if self.save_fn is not None:
            self.save_fn(checkpoint_path(self.state_dir, self.state.step), self.state)

    def log(self, row: dict) -> None:  # the related runs keep no trackers
        if row.get("skipped"):
            log.warning("step %d: %d non-finite update(s) skipped", row["step"], row["skipped"])

    def should_stop(self, next_seconds: float) -> str | None:
        why = self.stop.reason(next_seconds) if self.stop is not None else None
        if why:
            log.warning("saving and stopping at step %d of %d: %s", self.state.step, self.steps, why)
        return why


def train_loop(
    steps: int,
    val_every: int,
    step_fn: StepFn,
    validate_fn: ValidateFn,
    save_fn: SaveFn | None = None,
    state_dir: str | Path | None = None,
    state: RunState | None = None,
    desc: str = "related",
    stop: StopRequest | None = None,
) -> tuple[RunState, str | None]:
    """Run to `steps` from `state` (a resumed run) or from scratch, in the run loop every RL run shares
    (grpo.run_loop: a checkpoint at each validation); returns the final state and why it stopped early (None:
    it ran to the end)."""
    state = state or RunState()
    method = RelatedMethod(step_fn, validate_fn, state, save_fn, state_dir and Path(state_dir), stop, steps)
    stopped = run_loop(method, state, Cadence(steps, val_every), desc)
    return state, stopped
