"""The one run loop (grpo.run_loop) on a stand-in method, and the hooks a GRPO step offers an instrument
(grpo.step_hooks): what `margrpo plan` measures through instead of replacing the trainer's parts."""

import math

import pytest
import torch
from helpers import PROMPTS, redness, tiny_policy

from margrpo.grpo.config import GRPOConfig
from margrpo.grpo.rollout import SamplingConfig
from margrpo.grpo.run_files import RunState
from margrpo.grpo.run_loop import Cadence, StepAbandoned, run_loop
from margrpo.grpo.step_hooks import StepHooks
from margrpo.grpo.trainer import GRPOTrainer
from margrpo.prompts.suites import PromptSet
from margrpo.related.method import RelatedTrainer


class Counting:
    """A method whose step and validation are counters; it records what the loop asked of it, in order."""

    def __init__(self, stop_after: int | None = None):
        self.state, self.calls, self.stop_after, self.state_dir = RunState(), [], stop_after, None
        self.background, self.waits = [], 0  # each save's `background`; how often the loop waited for the saves

    def train_step(self):
        self.state.step += 1
        self.calls.append(("step", self.state.step))
        return {"step": self.state.step, "reward_mean": float(self.state.step)}

    def validate(self):
        self.calls.append(("validate", self.state.step))
        return [float(self.state.step), 1.0]

    def save(self, background=False):
        self.calls.append(("save", self.state.step))
        self.background.append(background)
        return 0.0

    def finish_saves(self, wait=True):
        self.waits += wait

    def log(self, row):
        self.calls.append(("log", row["step"]))

    def should_stop(self, next_seconds):
        assert next_seconds >= 0
        return "asked" if self.stop_after is not None and self.state.step >= self.stop_after else None


def test_the_loop_validates_the_base_then_every_val_every_and_the_last_step_saving_where_told():
    m = Counting()
    assert run_loop(m, m.state, Cadence(steps=5, val_every=2, save_every=3), "t", show=False) is None
    assert [c for c in m.calls if c[0] == "validate"] == [("validate", s) for s in (0, 2, 4, 5)]
    assert [c for c in m.calls if c[0] == "save"] == [("save", 3), ("save", 5)]
    assert m.background == [True, False] and m.waits == 1  # step 3's written behind step 4; the last at once
    # listed for selection: the base, and the saved steps that were validated (3 was saved, not validated)
    assert [c["step"] for c in m.state.checkpoints] == [0, 5] and m.state.checkpoints[0]["path"] is None
    rows = m.state.rows
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [math.isnan(r["val_reward"]) for r in rows] == [True, False, True, False, False]
    assert rows[1]["val_reward"] == 1.5  # the mean of the step's validation scores


def test_a_stop_request_saves_an_unlisted_checkpoint_and_returns_why():
    m = Counting(stop_after=2)
    assert run_loop(m, m.state, Cadence(steps=5, val_every=4), "t", show=False) == "asked"
    assert m.state.step == 2 and ("save", 2) in m.calls and ("step", 3) not in m.calls
    assert [c["step"] for c in m.state.checkpoints] == [0]  # a resumable state, not one for selection
    again = Counting()  # the resumed run: the loop goes on from the state it is given
    again.state = m.state
    assert run_loop(again, again.state, Cadence(steps=5, val_every=4), "t", show=False) is None
    assert [r["step"] for r in again.state.rows] == [1, 2, 3, 4, 5] and ("validate", 0) not in again.calls


def test_the_bar_shows_a_segments_first_step_however_quick(capsys):
    """The bar's mininterval (5 s) hides a quick step; a segment's first always shows, a fresh run's and a resumed
    run's: a job log tells its step time at once (and the SLURM suite's mid-rollout stop waits for that line)."""
    m = Counting(stop_after=2)
    run_loop(m, m.state, Cadence(steps=6, val_every=6), "t")
    first = capsys.readouterr().err
    again = Counting()
    again.state = m.state
    run_loop(again, again.state, Cadence(steps=6, val_every=6), "t")
    resumed = capsys.readouterr().err
    assert " 1/6 [" in first and " 3/6 [" in resumed, (first, resumed)


class Abandoning(Counting):
    """A method that gives up its step `at` + 1 in progress (its state as at the step's start)."""

    def __init__(self, at: int):
        super().__init__()
        self.at = at

    def train_step(self):
        if self.state.step == self.at:
            self.calls.append(("abandoned", self.at + 1))
            raise StepAbandoned("SIGTERM received")
        return super().train_step()


@pytest.mark.parametrize(
    "at,save_every,written",
    [
        (0, None, False),  # the run's first step: its start is the run's (a run started again begins the same way)
        (2, 3, True),  # step 3: step 2 was validated, not saved: the state of step 3's start is saved, unlisted
        (3, 3, False),  # step 4: step 3's periodic checkpoint is the state of its start: kept, not written again
    ],
)
def test_a_step_given_up_saves_the_state_of_its_start_unless_it_is_on_disk(at, save_every, written):
    m = Abandoning(at)
    assert run_loop(m, m.state, Cadence(steps=5, val_every=2, save_every=save_every), "t", show=False) == (
        "SIGTERM received"
    )
    assert m.state.step == at and [r["step"] for r in m.state.rows] == list(range(1, at + 1))
    given_up = m.calls.index(("abandoned", at + 1))
    assert m.calls[given_up:] == [("abandoned", at + 1)] + ([("save", at)] if written else [])
    assert [c["step"] for c in m.state.checkpoints] == [0]  # what a step given up saves is not for selection
    again = Abandoning(at)  # resumed at the step given up, and given up again at once: its checkpoint is kept
    again.state = m.state
    assert run_loop(again, again.state, Cadence(steps=5, val_every=2), "t", show=False) == "SIGTERM received"
    assert again.calls == [("abandoned", at + 1)]


class Stepping(RelatedTrainer):
    """A related trainer whose step is a counter: it advances the loop's one `step` itself."""

    def __init__(self, steps: int):
        super().__init__(torch.nn.Linear(1, 1), None, Cadence(steps, val_every=2), "t")
        self.seen = []

    def train_step(self):
        self.seen.append(self.step)
        self.step += 1
        return {"step": self.step, "reward_mean": 0.0, "skipped": int(self.step == 2)}

    def validate(self):
        return []


def test_a_related_method_in_memory_numbers_its_steps_and_logs_skipped_updates(caplog):
    method = Stepping(steps=3)
    assert method.train() is method.run.rows and method.stopped is None
    assert method.seen == [0, 1, 2] and [r["step"] for r in method.rows] == [1, 2, 3] and method.run.step == 3
    assert "step 2: 1 non-finite update(s) skipped" in caplog.text


class Recording(StepHooks):
    """An instrument that records what the step showed it, and chooses the first |M| AR steps (the plan's worst
    case) in place of the drawn ones."""

    def __init__(self, worst: bool):
        self.events, self.worst, self.drawn = [], worst, None

    def chosen(self, ar_steps, diffusion_steps):
        self.drawn = ar_steps
        return (torch.arange(len(ar_steps)), diffusion_steps) if self.worst else (ar_steps, diffusion_steps)

    def rolling_out(self):
        self.events.append("rolling_out")

    def recorded(self, record):
        self.events.append(("recorded", tuple(record.states.shape[:1])))

    def scored(self, batch):
        self.events.append(("scored", batch.ar_steps.tolist()))

    def replays(self, passes):
        self.events.append("replay")
        yield from passes
        self.events.append("replayed")


def _trainer(tmp_path, hooks):
    prompts = PromptSet(PROMPTS, [{}] * len(PROMPTS))
    cfg = GRPOConfig(steps=1, batch_prompts=2, group_size=2, mask_steps=2, diffusion_steps=2, precision="no")
    sampling = SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=2.0)
    return GRPOTrainer(tiny_policy("flow"), redness, prompts, prompts, sampling, cfg, tmp_path, hooks=hooks)


def test_the_step_shows_an_instrument_its_phases_and_takes_its_choice_of_steps(tmp_path):
    """Without hooks (the default StepHooks) and with a recording one that keeps the draw, the step is the same
    bits; with the worst case chosen, the batch is over the first |M| AR steps; the rollout stops where told."""
    plain = _trainer(tmp_path / "plain", None).train_step()
    watched = Recording(worst=False)
    row = _trainer(tmp_path / "watched", watched).train_step()
    assert {k: v for k, v in row.items() if k not in ("step_time_s", "peak_mem_mb")} == {
        k: v for k, v in plain.items() if k not in ("step_time_s", "peak_mem_mb")
    }
    assert watched.events == [
        "rolling_out",
        ("recorded", (4,)),
        ("scored", watched.drawn.tolist()),
        "replay",
        "replayed",
    ]
    worst = Recording(worst=True)
    worst.ar_step_limit = 3
    _trainer(tmp_path / "worst", worst).train_step()
    assert worst.events[1] == ("recorded", (3,)) and worst.events[2] == ("scored", [0, 1])
