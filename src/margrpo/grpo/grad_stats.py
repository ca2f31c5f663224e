"""The AR gradient's norm and its variance across micro-batches, from the accumulated gradients (Fig. 2a / Fig. 5)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


class MicroBatchGradStats:
    """Norm of the accumulated AR gradient and its variance across micro-batches (Fig. 2a / Fig. 5).

    Micro-batch c contributes g_c = grad after c - grad before c; scaled to the batch mean it is
    x_c = n g_c, whose mean over c is the accumulated gradient G. The per-element unbiased variance,
    averaged over the P elements, is (sum_c ||x_c||^2 - n ||G||^2) / ((n - 1) P): it needs only one
    snapshot of the previous gradient (in the parameters' dtype), not one flat copy per micro-batch,
    which matters at 0.6-2.3B AR parameters.

    With several processes the engines report the local squares (grpo.engine) and the gradients may be
    shards (DTensors): ||G|| is then summed over the shards by `reduce` (the engine's sum over processes).
    `exact` False (an FSDP group reduced twice in one micro-batch) makes the variance NaN rather than wrong.
    """

    def __init__(
        self, params: list[torch.nn.Parameter], n_micro: int, reduce: Callable[[torch.Tensor], torch.Tensor] = None
    ):
        self.params, self.n, self.reduce = params, n_micro, reduce or (lambda x: x)
        self.prev: list[torch.Tensor | None] = [None] * len(params)
        self.sq_sum = torch.zeros((), dtype=torch.float64)
        self.exact = True

    def snapshot(self) -> dict[int, torch.Tensor]:
        """The gradients as of the last `after_backward`, by parameter id (for DDP's hook)."""
        return {id(p): prev for p, prev in zip(self.params, self.prev) if prev is not None}

    def after_backward(self, last: bool) -> None:
        squares = []  # one sum per parameter, kept on its device: a single host sync per micro-batch
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            g = p.grad.detach().float() if self.prev[i] is None else p.grad.detach().float() - self.prev[i].float()
            squares.append(g.square().sum(dtype=torch.float64))
            self.prev[i] = None if last else p.grad.detach().clone()
        if squares:
            self.sq_sum += torch.stack(squares).sum().cpu()

    def result(self) -> tuple[float, float]:
        """(||G||, mean per-element variance across micro-batches; NaN with one micro-batch)."""
        squares = [
            _local(p.grad.detach()).float().square().sum(dtype=torch.float64)
            for p in self.params
            if p.grad is not None
        ]
        total = torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float64)
        if any(_local(p) is not p for p in self.params):  # shards: each element lives on one process
            total = self.reduce(total.cpu())
        total = float(total)
        count = sum(p.numel() for p in self.params)
        if self.n < 2 or not self.exact:
            return math.sqrt(total), float("nan")
        var = (self.n**2 * float(self.sq_sum) - self.n * total) / ((self.n - 1) * count)
        return math.sqrt(total), max(var, 0.0)


def _local(x: torch.Tensor) -> torch.Tensor:
    """This process's shard of a DTensor (FSDP), else x."""
    return x.to_local() if hasattr(x, "to_local") else x
