"""Gradient checkpointing for the policies' block stacks: a block keeps only its input in the forward pass
and is recomputed in backward (the same gradients, less activation memory). It acts whenever gradients are
enabled, not only in train mode, because GRPO replays in eval mode (`base.deterministic`)."""

from __future__ import annotations

import contextlib
import functools

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from margrpo.policy.invariant import batch_invariant, batch_invariant_active

_recompute_modes: list = []  # what `recomputing_under` adds to run_blocks' recomputation


def run_blocks(blocks, h: torch.Tensor, *args, checkpointing: bool = False) -> torch.Tensor:
    """`h` through each block; with `checkpointing` and gradients enabled, each block is recomputed in backward."""
    for block in blocks:
        if checkpointing and torch.is_grad_enabled():
            h = checkpoint(block, h, *args, use_reentrant=False, context_fn=functools.partial(_block_modes, block))
        else:
            h = block(h, *args)
    return h


def _block_modes(block: nn.Module):
    before, recompute = forward_mode(block)
    return before, _within(recompute, list(_recompute_modes)) if _recompute_modes else recompute


@contextlib.contextmanager
def _within(recompute, modes: list):
    with recompute, contextlib.ExitStack() as stack:
        for mode in modes:
            stack.enter_context(mode)
        yield


@contextlib.contextmanager
def recomputing_under(mode):
    """For the duration, the blocks run_blocks checkpoints are recomputed in backward under `mode` (a torch function
    mode) too. margrpo plan's CUDA autocast policy: torch restores CPU autocast for the recomputation, and with it
    the CPU's policy, which would recompute other dtypes than the forward saved. Transformers' own checkpointing
    (Harmon's LLM) is not covered."""
    _recompute_modes.append(mode)
    try:
        yield
    finally:
        _recompute_modes.remove(mode)


def forward_mode(module: nn.Module):
    """checkpoint's `context_fn`: recompute in the train/eval mode of the forward pass, and with its
    batch-invariant products if it had them. GRPO replays in eval mode (`base.deterministic`) but calls
    backward after leaving it, so a block would otherwise be recomputed in train mode, with dropout
    (MAR-H's 0.1), or with other products: other tensors, which torch refuses."""
    flags = [(m, m.training) for m in module.modules()]
    blocked = batch_invariant_active()

    @contextlib.contextmanager
    def as_in_forward():
        now = [(m, m.training) for m, _ in flags]
        for m, flag in flags:
            m.training = flag
        try:
            with batch_invariant() if blocked else contextlib.nullcontext():
                yield
        finally:
            for m, flag in now:
                m.training = flag

    return contextlib.nullcontext(), as_in_forward()


@contextlib.contextmanager
def hf_checkpointing(model: nn.Module, enabled: bool):
    """transformers checkpoints a layer only in train mode, and GRPO replays in eval mode: mark the
    checkpointed layers themselves (not their submodules, so attention dropout stays off) as training."""
    layers = [
        m
        for m in model.modules()
        if enabled
        and getattr(m, "gradient_checkpointing", False)
        and hasattr(m, "_gradient_checkpointing_func")
        and not m.training
    ]
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m in layers:
            m.training = False
