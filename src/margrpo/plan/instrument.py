"""The step as the plan takes it, patched around the trainer's own code: the ledger's phases, CUDA's autocast
policy where the trainer opens autocast, the worst case of the chosen AR steps, a rollout cut short with the
record of its missing steps added exactly, and the CUDA branch of CPU-only code."""

from __future__ import annotations

import contextlib
import importlib
from functools import partial

import torch

from margrpo.plan.cuda_autocast import CudaAutocast
from margrpo.plan.ledger import Ledger


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _per_step(r) -> list:
    """A rollout's tensors with one entry per AR step (the record's size grows with K)."""
    return [r.known, r.committed, r.states, r.log_probs]


def _batch_invariant_owners() -> list:
    """(module, value) of `batch_invariant` wherever it was imported (margrpo.policy.invariant, where it exists)."""
    blocks = []
    for name in ("margrpo.policy.invariant", "margrpo.policy.base", "margrpo.policy.checkpointing"):
        try:
            owner = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(owner, "batch_invariant"):
            blocks.append((owner, owner.batch_invariant))
    return blocks


def _forward_mode_with_amp(forward_mode, amp: CudaAutocast, block):
    """A checkpointed block recomputes in backward under CUDA's policy too (torch restores CPU autocast there, and
    with it the CPU's policy, which would recompute other dtypes than the forward saved)."""
    before, recompute = forward_mode(block)

    @contextlib.contextmanager
    def both():
        with recompute, amp:
            yield

    return before, both()


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


def _wrap_phases(ledger: Ledger, trainer, chosen: str, grow) -> None:
    """The ledger's phases around the trainer's methods: rollout (rollout_and_score), replay (the backward passes of
    `backwards`), optimizer (clip and AdamW); with `chosen` "first", the first |M| AR steps are the chosen ones."""
    rollout_and_score, backwards, choose = trainer.rollout_and_score, trainer.backwards, trainer.choose_steps

    def rollout():
        ledger.set_phase("rollout")
        batch = rollout_and_score()
        grow([batch.mte_mask, batch.sim_keep])
        kept = [batch.adv, batch.rewards, batch.mte_mask, batch.sim_keep, *batch.rows]
        kept += [v for r in [batch.rollout, *batch.subs] for v in vars(r).values() if isinstance(v, torch.Tensor)]
        ledger.retag([t for t in kept if t is not None], "record")  # lives through the replay
        ledger.set_phase("between")
        return batch

    def replay(*args):
        ledger.set_phase("replay")
        yield from backwards(*args)
        ledger.set_phase("optimizer", "optim")

    def worst(g):
        ar, diff = choose(g)
        return torch.arange(len(ar)), diff

    trainer.rollout_and_score, trainer.backwards = rollout, replay
    if chosen == "first":
        trainer.choose_steps = worst
    trainer.optimizer.register_step_post_hook(lambda *_: ledger.set_phase("after"))


def _module_patches(saved: tuple, amp: CudaAutocast, R: int, grow) -> tuple:
    """Replacements for (engine.autocast, trainer.subset_rollout, rollout.ar_schedule, rollout._Record.empty):
    CUDA's policy in the trainer's autocast regions, a schedule cut at R AR steps, and the record of the missing
    steps added to the ledger where a rollout's record is made."""

    def cuda_policy(device, precision):
        @contextlib.contextmanager
        def region():
            with saved[0](device, precision):
                yield
            if not torch.is_autocast_enabled("cpu"):
                amp.clear()

        return region()

    def subset(r, rows):
        sub = saved[1](r, rows)
        grow(_per_step(sub))
        return sub

    def schedule(policy, sampling):
        return saved[2](policy, sampling)[:R]

    def empty(*args, **kwargs):
        rec = saved[3](*args, **kwargs)
        grow(_per_step(rec))
        return rec

    return cuda_policy, subset, schedule, empty


@contextlib.contextmanager
def instrumented(ledger: Ledger, trainer, amp: CudaAutocast, steps: int | None, chosen: str = "first"):
    """The step as the plan takes it, around the trainer's own code:
    - the ledger's phases: rollout (rollout_and_score), replay (backwards), optimizer (clip and AdamW);
    - CUDA's autocast policy where the trainer opens autocast;
    - `chosen` "first": the worst case of the |M| chosen AR steps for memory, the first |M|, which predict the most
      tokens (the trainer draws them at random; over a run every one is drawn). Its diffusion steps are the
      trainer's draw (all hold the same number of rows). "drawn": the trainer's own draw;
    - `steps`: the rollout stops after that many AR steps of the configured schedule (at least |M|). Its peak does
      not depend on later steps (step 0 predicts every token; the AR's transients are the same at every step); the
      record of the missing steps, and of their copies, is added to the ledger exactly (`phantom`);
    - CPU-only code takes its CUDA branch: `margrpo.policy.invariant.batch_invariant` (fixed row blocks for F.linear
      on CPU tensors; CUDA tensors pass through it untouched), where that module exists, is left out.
    Yields (K, R): the AR steps of the schedule and those the rollout runs."""
    import margrpo.grpo.engine as engine_module  # the trainer's autocast regions: Engine.autocast
    import margrpo.grpo.rollout as rollout_module
    import margrpo.grpo.trainer as module
    import margrpo.policy.checkpointing as checkpointing

    blocks = _batch_invariant_owners()
    forward_mode = checkpointing.forward_mode
    saved = (engine_module.autocast, module.subset_rollout, rollout_module.ar_schedule, rollout_module._Record.empty)
    K = len(saved[2](trainer.policy, trainer.sampling))
    R = _rollout_steps(trainer, K, steps, chosen)
    grow = partial(_grow, ledger, K, R)
    _wrap_phases(ledger, trainer, chosen, grow)
    cuda_policy, subset, schedule, empty = _module_patches(saved, amp, R, grow)
    engine_module.autocast, module.subset_rollout, rollout_module.ar_schedule = cuda_policy, subset, schedule
    rollout_module._Record.empty = empty
    checkpointing.forward_mode = partial(_forward_mode_with_amp, forward_mode, amp)
    for owner, _ in blocks:
        owner.batch_invariant = contextlib.nullcontext
    try:
        yield K, R
    finally:
        engine_module.autocast, module.subset_rollout, rollout_module.ar_schedule = saved[:3]
        rollout_module._Record.empty = saved[3]
        checkpointing.forward_mode = forward_mode
        for owner, value in blocks:
            owner.batch_invariant = value
