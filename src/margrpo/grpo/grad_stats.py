"""The gradient statistics of Fig. 2a / Fig. 5: the norm of the batch gradient of the AR (the head's, with the AR
frozen), logged every update, and its variance across micro-batches, an opt-in probe (`grpo.grad_variance`)."""

from __future__ import annotations

import torch
from torch import nn

from margrpo.grpo.engine import local_shard


def grad_square_norm(params: list[nn.Parameter], engine) -> float:
    """||G||^2 of `params`' accumulated (reduced) gradients; under FSDP each process holds shards, summed once."""
    squares = [
        local_shard(p.grad.detach()).float().square().sum(dtype=torch.float64) for p in params if p.grad is not None
    ]
    total = torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float64)
    if any(local_shard(p) is not p for p in params):  # shards: each element lives on one process
        total = engine.shard_sum(total.cpu())
    return float(total)


class GradVarianceProbe:
    """Mean per-element variance of the batch gradient across micro-batches, read from `.grad` after each one.

    Micro-batch c adds g_c to `.grad`; scaled to the batch mean, x_c = n g_c has mean G over the n micro-batches,
    and the unbiased per-element variance averaged over the P elements is (sum_c ||x_c||^2 - n ||G||^2) /
    ((n - 1) P). It needs one snapshot of the gradient before each micro-batch (in the parameters' dtype), not one
    copy per micro-batch. Under several processes what `.grad` shows after a micro-batch decides the estimator:
    - one process, or DDP (which reduces only after the last micro-batch): each process's own micro-batches, n =
      micro-batches x processes; the last one's local gradient is read in DDP's communication hook before its
      all-reduce (`observe_local`, which the engine calls from that hook), so the statistic is the one a single
      process computes;
    - FSDP (which reduce-scatters every micro-batch into the shards): the increment of micro-batch c is the sum
      d_c of the W processes' c-th micro-batches, read from this process's shard. With i.i.d. micro-batches
      Var(n d_c) = Var(x) / W, so W times the variance of the n per-process rounds estimates the same quantity
      with n - 1 instead of nW - 1 degrees of freedom (so it needs two micro-batches a process). Nothing but the
      sharded snapshot is held: no unsharded copy of any gradient.

    Whoever builds the engine makes it (grpo.build.probe): `rounds` is the engine's `reduces_each_micro_batch`, and
    `observe_local` is attached with `engine.observe_local_gradients`, the engine's hook on local gradients."""

    def __init__(self, params: list[nn.Parameter], micro_batches: int, engine, rounds: bool = False):
        self.params, self.engine = params, engine
        self.index = {id(p): i for i, p in enumerate(params)}
        self.rounds = rounds  # FSDP: each increment sums the processes' micro-batches
        self.n = micro_batches if self.rounds else micro_batches * engine.world
        if self.n < 2:
            how = ", each reduced over the processes (FSDP)" if self.rounds else ""
            raise ValueError(
                f"grpo.grad_variance: a variance across micro-batches needs two or more, and this run has {self.n} "
                f"({micro_batches} a process{how}); set grpo.micro_batches to 2 or more, or grad_variance to false"
            )
        self.prev: list[torch.Tensor | None] = [None] * len(params)
        self.sq_sum = torch.zeros((), dtype=torch.float64)
        self.last: list[torch.Tensor] = []  # DDP: the last micro-batch's local squares, from the hook

    def start(self) -> None:
        """Before an optimizer step's first micro-batch."""
        self.prev = [None] * len(self.params)
        self.sq_sum = torch.zeros((), dtype=torch.float64)

    def after_micro_batch(self, last: bool) -> None:
        """After a micro-batch's backward (all its chunks): add ||g_c||^2, the square of the gradient's increment."""
        if last and self.engine.world > 1 and not self.rounds:  # DDP: `.grad` is every process's sum by now
            squares, self.last = self.last, []  # the hook read this process's own increment before the all-reduce
        else:
            squares = []  # one sum per parameter, kept on its device: a single host sync per micro-batch
            for i, p in enumerate(self.params):
                if p.grad is None:
                    continue
                grad = local_shard(p.grad.detach())
                g = grad.float() if self.prev[i] is None else grad.float() - self.prev[i].float()
                squares.append(g.square().sum(dtype=torch.float64))
                self.prev[i] = None if last else grad.clone()
        if squares:
            self.sq_sum += torch.stack(squares).sum().cpu()

    def observe_local(self, param: nn.Parameter, local: torch.Tensor) -> None:
        """DDP's hook, before the last micro-batch's all-reduce: this process's accumulated local gradient."""
        i = self.index[id(param)]
        prev = self.prev[i]
        g = local.float() if prev is None else local.float() - prev.float()
        self.last.append(g.square().sum(dtype=torch.float64))
        self.prev[i] = None

    def columns(self, square_norm: float) -> dict[str, float]:
        """The update's log columns, given ||G||^2 (`grad_square_norm`)."""
        return {"grad_var_ar": self.result(square_norm)}

    def result(self, square_norm: float) -> float:
        """The variance, given ||G||^2 (`grad_square_norm`)."""
        sq_sum = self.engine.shard_sum(self.sq_sum) if self.rounds else self.engine.all_sum(self.sq_sum)
        count = sum(p.numel() for p in self.params)
        var = (self.n**2 * float(sq_sum) - self.n * square_norm) / ((self.n - 1) * count)
        if self.rounds:
            var *= self.engine.world
        return max(var, 0.0)


class NoProbe:
    """The probe's place where `grpo.grad_variance` is off or cannot be taken: it reads nothing and logs no column."""

    def start(self) -> None:
        pass

    def after_micro_batch(self, last: bool) -> None:
        pass

    def columns(self, square_norm: float) -> dict[str, float]:
        return {}
