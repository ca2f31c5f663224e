"""What every related method's trainer (MaskGRPO's and plain GRPO's on toy-mask, MARVAL-RL) shares as the run loop's
`Method` (grpo.run_loop), beside the step and the validation each one runs itself: the loop's `RunState` and its one
`step` counter, the checkpoints (grpo.checkpoints' `Checkpointer`, as the GRPO trainer's: resume only under settings
that give the same steps, refuse or with --restart set aside any other state, the training state through
torch.distributed.checkpoint), the stop request and the log.

In memory (`train()` alone) a run keeps no checkpoints; `keep_state` makes it write `margrpo train`'s run files
(state/ckpt-XXXXXX/policy at each validation, the training state beside it, state/trainer.pt naming the latest),
so `select`, `sample`, `evaluate` and `report` read a related run unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from margrpo.grpo.checkpoints import Checkpointer, Part, replace_policy_folder
from margrpo.grpo.engine import Engine
from margrpo.grpo.run_files import RunState
from margrpo.grpo.run_loop import Cadence, run_loop
from margrpo.infra.stopping import StopRequest

log = logging.getLogger(__name__)


class RelatedTrainer:
    """A related method's run: a subclass runs the step (`train_step`, advancing `step`) and the validation
    (`validate`); `cfg` has the run's `steps` and `val_every`; `parts`: its training state beyond the policy and the
    optimizer (grpo.checkpoints.Part)."""

    def __init__(
        self, policy: nn.Module, optimizer: torch.optim.Optimizer, cfg, desc: str, parts: dict[str, Part] | None = None
    ):
        self.policy, self.optimizer, self.cfg, self.desc, self.parts = policy, optimizer, cfg, desc, parts or {}
        self.run = RunState()  # steps run, their rows, the validations (grpo.run_loop)
        self.state_dir: Path | None = None  # None: a run in memory, no checkpoints
        self.checkpointer: Checkpointer | None = None
        self.header: dict = {}  # what each checkpoint's header records of the run's settings
        self.stop_request: StopRequest | None = None
        self.stopped: str | None = None  # why `train` saved and stopped early (None: it ran to the end)

    step = property(lambda self: self.run.step, lambda self, v: setattr(self.run, "step", v))
    rows = property(lambda self: self.run.rows)
    checkpoints = property(lambda self: self.run.checkpoints)

    def keep_state(
        self,
        state_dir: str | Path,
        record: dict,
        legacy_hash: str,
        restart: bool = False,
        on_accept: Callable[[], None] | None = None,
    ) -> bool:
        """Checkpoint into `state_dir`, resuming what it holds where `record` (the settings one by one,
        grpo.checkpoints.flat_record) gives the same steps; else stop naming why, or with `restart` move it aside.
        `on_accept` runs once the state is accepted, before anything is loaded. Returns whether it resumed."""
        self.state_dir = Path(state_dir)
        self.checkpointer = Checkpointer(
            self.policy,
            self.optimizer,
            Engine(self.policy, self.policy.device),
            self.state_dir,
            parts=self.parts,
            write_policy=replace_policy_folder,
            read_policy=lambda folder: type(self.policy).from_pretrained(folder),  # a state of before issue 69
        )
        self.checkpointer.on_accept = on_accept
        self.header = {"record": record, "spec_hash": legacy_hash}
        header = self.checkpointer.resume(record, legacy_hash, restart)
        if header is None:
            return False
        self.run = RunState(header["step"], header["rows"], header["checkpoints"])
        return True

    def train(self, stop: StopRequest | None = None) -> list[dict]:
        """Run to `cfg.steps` from where the run is; with `stop`, save and stop early when it says the next step
        would not end in time (`stopped` says why). Returns the metrics rows, one per step."""
        self.stop_request = stop
        self.stopped = run_loop(self, self.run, Cadence(self.cfg.steps, self.cfg.val_every), self.desc)
        return self.rows

    # --- the run loop's side (grpo.run_loop) ----------------------------------------------------------------------
    def save(self, background: bool = False) -> float:
        if self.checkpointer is None:
            return 0.0
        header = {**self.header, "rows": self.rows, "checkpoints": self.checkpoints}
        return self.checkpointer.save(self.step, header, background)

    def finish_saves(self, wait: bool = True) -> None:
        if self.checkpointer is not None:
            self.checkpointer.finish(wait)

    def log(self, row: dict) -> None:  # the related runs keep no trackers
        if row.get("skipped"):
            log.warning("step %d: %d non-finite update(s) skipped", row["step"], row["skipped"])

    def should_stop(self, next_seconds: float) -> str | None:
        why = self.stop_request.reason(next_seconds) if self.stop_request is not None else None
        if why:
            log.warning("saving and stopping at step %d of %d: %s", self.step, self.cfg.steps, why)
        return why
