"""The step as the plan takes it: through the hooks the step offers (grpo.step_hooks), the ledger's phases, the
worst case of the chosen AR steps, a rollout cut short with the record of its missing steps added exactly; and,
emulating a GPU on this CPU, CUDA's autocast policy where the trainer opens autocast and the CUDA branch of
CPU-only code."""

from __future__ import annotations

import contextlib
from functools import partial

import torch

from margrpo.grpo.step_hooks import StepHooks
from margrpo.plan.cuda_autocast import CudaAutocast
from margrpo.plan.ledger import Ledger
from margrpo.policy.checkpointing import recomputing_under
from margrpo.policy.invariant import as_on_gpu


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _per_step(r) -> list:
    """A rollout's tensors with one entry per AR step (the record's size grows with K)."""
    return [r.known, r.committed, r.states, r.log_probs]


def _rollout_steps(trainer, K: int, steps: int | None, chosen: str) -> int:
    """R, the AR steps the rollout runs: `steps` (at least |M|; None: all K); with `chosen` "drawn", at least up to
    the last AR step the trainer will draw."""
    R = K if steps is None else max(steps, trainer.cfg.mask_steps)
    if chosen == "drawn":  # the rollout must reach the last AR step the trainer will draw
        from margrpo.grpo.random_streams import step_generator

        R = max(R, int(trainer.choose_steps(step_generator(trainer.cfg.seed, trainer.step, 3))[0].max()) + 1)
    return R


def _grow(ledger: Ledger, K: int, R: int, tensors) -> None:
    """The missing AR steps' share of these per-step tensors."""
    ledger.phantom("record", _nbytes(tensors) * (K - R) // R)


class PlanHooks(StepHooks):
    """The plan's view of a step through the hooks it offers (grpo.step_hooks): the ledger's phases (rollout,
    between, replay, optimizer; "after" from the optimizer's own post-step hook), the worst case of the chosen AR
    steps, and a rollout cut at R of K AR steps with the record of the missing ones added to the ledger exactly."""

    def __init__(self, ledger: Ledger):
        self.ledger, self.worst = ledger, False
        self.grow = lambda tensors: None

    def cut(self, K: int, R: int, worst: bool) -> None:
        """Run R of the schedule's K AR steps; `worst`: the first |M| AR steps are the chosen ones."""
        self.ar_step_limit, self.worst, self.grow = R, worst, partial(_grow, self.ledger, K, R)

    def chosen(self, ar_steps, diffusion_steps):
        return (torch.arange(len(ar_steps)), diffusion_steps) if self.worst else (ar_steps, diffusion_steps)

    def rolling_out(self) -> None:
        self.ledger.set_phase("rollout")

    def recorded(self, record) -> None:
        self.grow(_per_step(record))

    def scored(self, batch) -> None:
        for sub in batch.subs:
            self.grow(_per_step(sub))
        self.grow([batch.mte_mask, batch.sim_keep])
        kept = [batch.adv, batch.rewards, batch.mte_mask, batch.sim_keep, *batch.rows]
        kept += [v for r in [batch.rollout, *batch.subs] for v in vars(r).values() if isinstance(v, torch.Tensor)]
        self.ledger.retag([t for t in kept if t is not None], "record")  # lives through the replay
        self.ledger.set_phase("between")

    def replays(self, passes):
        self.ledger.set_phase("replay")
        yield from passes
        self.ledger.set_phase("optimizer", "optim")


def _clear_after_outermost(amp: CudaAutocast):
    """An autocast exit hook: CUDA's cache of cast weights lives until the outermost autocast region closes."""

    def clear() -> None:
        if not torch.is_autocast_enabled("cpu"):
            amp.clear()

    return clear


@contextlib.contextmanager
def instrumented(ledger: Ledger, trainer, amp: CudaAutocast, steps: int | None, chosen: str = "first"):
    """The step as the plan takes it. Through the step's own hooks (`trainer.hooks`, a `PlanHooks` given to the
    trainer when it was made):
    - the ledger's phases: rollout, replay (the backward passes), optimizer (clip and AdamW);
    - `chosen` "first": the worst case of the |M| chosen AR steps for memory, the first |M|, which predict the most
      tokens (the trainer draws them at random; over a run every one is drawn). Its diffusion steps are the
      trainer's draw (all hold the same number of rows). "drawn": the trainer's own draw;
    - `steps`: the rollout stops after that many AR steps of the configured schedule (at least |M|). Its peak does
      not depend on later steps (step 0 predicts every token; the AR's transients are the same at every step); the
      record of the missing steps, and of their copies, is added to the ledger exactly (`phantom`).
    Emulating a GPU's kernels on this CPU (not the step's choices, so not its hooks), for the block's duration:
    - CUDA's autocast policy where the trainer opens autocast (Engine.autocast, whose exit hook ends the cache of
      cast weights), checkpointed blocks included (`checkpointing.recomputing_under`);
    - CPU-only code takes its CUDA branch: `margrpo.policy.invariant.batch_invariant` (fixed row blocks for F.linear
      on CPU tensors; CUDA tensors pass through it untouched) does nothing (`invariant.as_on_gpu`).
    Yields (K, R): the AR steps of the schedule and those the rollout runs."""
    hooks = trainer.hooks
    if not isinstance(hooks, PlanHooks):
        raise TypeError("instrumented: make the trainer with hooks=PlanHooks(ledger)")
    K = trainer.ar_steps
    R = _rollout_steps(trainer, K, steps, chosen)
    hooks.cut(K, R, worst=chosen == "first")
    trainer.optimizer.register_step_post_hook(lambda *_: ledger.set_phase("after"))
    cache = trainer.engine.register_autocast_exit_hook(_clear_after_outermost(amp))
    try:
        with recomputing_under(amp), as_on_gpu():
            yield K, R
    finally:
        cache.remove()
