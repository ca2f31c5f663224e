"""Where an instrument sees into a GRPO step, or chooses for it, without replacing any of its parts (`margrpo
plan` measures memory through these). Each default leaves the step exactly as it is; an instrument subclasses."""

from __future__ import annotations

from collections.abc import Iterator

from torch import Tensor


class StepHooks:
    ar_step_limit: int | None = None  # the rollout stops after this many AR steps (None: the whole schedule)

    def chosen(self, ar_steps: Tensor, diffusion_steps: Tensor) -> tuple[Tensor, Tensor]:
        """The step's |M| AR steps and their diffusion steps as drawn -> as used (the plan: the worst case)."""
        return ar_steps, diffusion_steps

    def rolling_out(self) -> None:
        """Before the step's rollout."""

    def recorded(self, record) -> None:
        """A rollout's record (grpo.rollout), as generation allocates it, before the first AR step fills it."""

    def ar_step(self, k: int) -> None:
        """Before the rollout's AR step k (its pass, then its diffusion steps)."""

    def scored(self, batch) -> None:
        """The step's batch (grpo.step_plan.StepBatch): rolled out, scored, split in micro-batches; no update yet."""

    def replays(self, passes: Iterator) -> Iterator:
        """An update's backward passes (grpo.step_plan.Backward), as they run (then its clip and optimizer step)."""
        return passes
