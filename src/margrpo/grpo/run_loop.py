"""The one training loop of every RL run (the GRPO trainer and the related methods): it owns the run's `RunState`,
the validation and checkpoint cadence, the progress bar and stop requests; a method supplies what a step is.

A method (`Method`) shares the loop's `RunState`: it runs one step and returns its metrics row (advancing the
state's `step` itself: the GRPO trainer's random streams are keyed by it), validates from fixed noise, writes a
checkpoint of the state, logs a row to its trackers, and says whether to stop before another step. The loop
decides when:

- the base policy is validated once, before the first step (checkpoint 0, no folder: `base_val_*`);
- a step is validated every `val_every` steps and at the last step (`val_reward` NaN between);
- a checkpoint is written every `save_every` steps and at the last step, or, with `save_every` None, at each
  validation; it is listed for selection where the step was validated; the training state of one before the last
  step is written behind the next steps (the method's `save(background=True)`) and named the one to resume from
  before the first step that begins after its writing is over (`finish_saves`); every other save is written at
  once, and the loop returns only once every save is on disk;
- with a stop request, when the method says the next step would not end in time, the state is saved and the loop
  returns why (a resumed run goes on from there);
- a method may give up a step in progress instead (`StepAbandoned`, raised from `train_step` before its first
  optimizer step began: the GRPO trainer's stop checks inside a step; the related methods stop between steps only):
  the run state is then the step's start, which is saved unless its checkpoint is there already (the run's start,
  step 0, is its own: a run started again begins the same way), and the loop returns why. The resumed run repeats
  the step from its keyed random streams.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tqdm.auto import tqdm

from margrpo.grpo.run_files import RunState, checkpoint_path


@dataclass(frozen=True)
class Cadence:
    steps: int
    val_every: int
    save_every: int | None = None  # None: a checkpoint at each validation

    def validates(self, step: int) -> bool:
        return step % self.val_every == 0 or step == self.steps

    def saves(self, step: int, validated: bool) -> bool:
        if self.save_every is None:
            return validated
        return step % self.save_every == 0 or step == self.steps


class StepAbandoned(Exception):
    """A step given up before its first optimizer step began (str: why): the method's run state, parameters and
    optimizer are as they were at the step's start."""


class Method(Protocol):
    state_dir: Path | None  # where checkpoints go (None: a run in memory)

    def train_step(self) -> dict:
        """Run the next step (advancing the run state's `step`) and return its metrics row; or raise StepAbandoned
        with the state as it was."""

    def validate(self) -> list[float]:
        """One reward per validation prompt, from fixed noise (paired across steps and runs)."""

    def save(self, background: bool = False) -> float:
        """The checkpoint of the run state's step (the loop has listed it in its `checkpoints` where validated),
        written behind the next steps where `background`; returns the longest time a save took so far, in full."""

    def finish_saves(self, wait: bool = True) -> None:
        """Every save written behind the steps whose writing is over named as the run's checkpoint (`wait`: once
        every save begun is on disk)."""

    def log(self, row: dict) -> None:
        """The row to the run's trackers (nothing where it has none)."""

    def should_stop(self, next_seconds: float) -> str | None:
        """Why the run should save and stop before a step of `next_seconds` (None: go on)."""


def mean(scores: list[float]) -> float:
    return sum(scores) / len(scores) if scores else float("nan")


def run_loop(method: Method, state: RunState, cadence: Cadence, desc: str, show: bool = True) -> str | None:
    """Run `method` from `state` (a resumed run's, or a fresh one) to `cadence.steps`; returns why it stopped early,
    or None when it ran to the end. `show`: the progress bar (the main process's)."""
    step_s = val_s = save_s = 0.0  # the longest step, validation and save so far: what one more step costs
    if not state.checkpoints:  # the base policy, before any update
        started = time.monotonic()
        scores = method.validate()
        val_s = time.monotonic() - started
        state.checkpoints = [{"step": 0, "val_reward": mean(scores), "val_scores": scores, "path": None}]
    bar = tqdm(total=cadence.steps, initial=state.step, desc=desc, mininterval=5, disable=not show)
    stopped = None
    saved_at = first_step = state.step  # the step whose state is on disk: a resumed run's checkpoint, or the start
    while state.step < cadence.steps:
        method.finish_saves(wait=False)  # a save written behind the last steps becomes the one to resume from
        started = time.monotonic()
        try:
            row = method.train_step()
        except StepAbandoned as abandoned:
            stopped = str(abandoned)
        if stopped:  # outside the handler: the step's tensors, held by the traceback, are gone before the save
            if saved_at != state.step:
                _save(method, state, float("nan"), None)
            break
        step_s, scores = max(step_s, time.monotonic() - started), None
        if cadence.validates(state.step):
            started = time.monotonic()
            scores = method.validate()
            val_s = max(val_s, time.monotonic() - started)
        row["val_reward"] = float("nan") if scores is None else mean(scores)
        state.rows.append(row)
        method.log(row)
        saved = cadence.saves(state.step, scores is not None)
        if saved:  # a periodic save is written behind the next steps; the last step's at once
            started = time.monotonic()
            longest = _save(method, state, row["val_reward"], scores, background=state.step < cadence.steps)
            save_s, saved_at = max(save_s, time.monotonic() - started, longest or 0.0), state.step
        bar.set_postfix(
            reward=f"{row.get('reward_mean', math.nan):.3f}", val=f"{row['val_reward']:.3f}", refresh=False
        )
        if not bar.update(1) and state.step == first_step + 1:  # mininterval hides a step under 5 s: a segment's
            bar.refresh()  # first shows at once (its step time)
        if state.step < cadence.steps:
            # the next step, its validation where it has one, and a save (each not yet seen: a step's time)
            validation = (val_s or step_s) if cadence.validates(state.step + 1) else 0.0
            stopped = method.should_stop(step_s + validation + (save_s or step_s))
            if stopped:
                if not saved:
                    _save(method, state, float("nan"), None)  # resumable state; not a checkpoint for selection
                break
    bar.close()
    method.finish_saves()
    return stopped


def _save(
    method: Method, state: RunState, val_reward: float, scores: list[float] | None, background: bool = False
) -> float:
    """Save, and list the checkpoint for selection where it was validated; the longest save's seconds so far."""
    if math.isfinite(val_reward):
        path = str(checkpoint_path(method.state_dir, state.step)) if method.state_dir else None  # None: in memory
        state.checkpoints.append({"step": state.step, "val_reward": val_reward, "val_scores": scores, "path": path})
    return method.save(background)
