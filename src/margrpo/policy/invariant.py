"""Batch-invariant matrix products on CPU: a row's result has the same bits in whatever batch it comes.

The rollout computes a token's head output and z in batches of one size (its AR step's unknown tokens, CFG's two
branches, MTE's extra trajectories), the replay in batches of another (the chosen steps of a micro-batch). A BLAS
picks its kernel and splits its threads by the shape, so a row's last bits can depend on how many rows came with
it, and the head's log-density multiplies one ulp of its mean by 1 / sigma^2: the PPO ratio with unchanged
parameters then misses design.md §3.2's 1 to 1e-5.

`batch_invariant()` computes every `F.linear` on CPU tensors (nn.Linear, the policies' own calls, peft's
adapters, transformers' layers) in blocks of exactly `ROW_BLOCK` rows, the last padded with zero rows: every
product has one shape, and a row's result depends on that row alone. Rollout and replay run inside it
(`base.deterministic`); the backward is F.linear's own. CUDA tensors are left alone (the GPU runs gave ratio 1.0
exactly, and blocks would cost kernel launches). What was measured, on which CPUs and MKL paths, and what it
costs: docs/findings.md ("Do two CPUs give the same numbers?", "Where does a step's CPU go").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

# Rows per matrix product: >= 8 (MKL's small-M kernels differ); the padding against the number of calls, measured
# in docs/findings.md.
ROW_BLOCK = 256
_LINEAR = torch._C._nn.linear  # F.linear itself, whatever F.linear names while batch_invariant() is on


def row_blocked_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear(x, weight, bias) computed ROW_BLOCK rows at a time (the last block padded with zeros):
    each row's result is then the same bits in any batch. x [..., in] -> [..., out]. The backward is
    F.linear's own (one product over all rows each for the input's and the weight's gradient)."""
    if x.shape[:-1].numel() == 0:
        return _LINEAR(x, weight, bias)
    if not torch.is_autocast_enabled("cpu"):
        return _rows_linear(x, weight, bias)
    dtype = torch.get_autocast_dtype("cpu")  # autocast's cast for linear, done here: the products run in its dtype

    # as autocast: not float64
    def cast(t):
        return t if t is None or t.dtype == torch.float64 else t.to(dtype)

    with torch.autocast("cpu", enabled=False):
        return _rows_linear(cast(x), cast(weight), cast(bias))


def _rows_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    rows = x.reshape(-1, x.shape[-1])
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias))
    y = _RowBlockedLinear.apply(rows, weight, bias) if needs_grad else _blocked(rows, weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])


def _blocked(rows: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """rows [n, in] -> [n, out]: one product call per ROW_BLOCK rows, the whole blocks read and written in place,
    the last rows through a block padded with zero rows; each block starts on a 64-byte boundary, as a fresh
    tensor does (MKL's result may depend on the alignment). One call per block, all alike: a batched product
    over the blocks (bmm) was not invariant (MKL shares a batch among its threads by the batch's size: 1.8e-4
    and 5.4e-3 in the toys' ratio at 32 threads with MKL_CBWR=AVX2, measured)."""
    n, B = rows.shape[0], ROW_BLOCK
    rows = rows.contiguous()
    if rows.data_ptr() % 64 or (B * rows.shape[1] * rows.element_size()) % 64:
        rows = rows.clone()
    full = n - n % B
    y = rows.new_empty(n, weight.shape[0])
    wt = weight.t()
    for a in range(0, full, B):  # F.linear's own call for a 2-D input, into its rows of y
        if bias is None:
            torch.mm(rows[a : a + B], wt, out=y[a : a + B])
        else:
            torch.addmm(bias, rows[a : a + B], wt, out=y[a : a + B])
    if n > full:
        last = rows.new_zeros(B, rows.shape[1])
        last[: n - full] = rows[full:]
        y[full:] = _LINEAR(last, weight, bias)[: n - full]
    return y


class _RowBlockedLinear(torch.autograd.Function):
    """Forward in blocks of ROW_BLOCK rows; backward as autograd's for addmm(bias, x, weight.t()) (bitwise the same
    gradients as F.linear on a 2-D or contiguous input: the toys' training numbers do not move)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _blocked(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        return (
            grad.mm(weight) if need_x else None,
            grad.t().mm(x) if need_w else None,
            grad.sum(0) if ctx.has_bias and need_b else None,
        )


def _linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear while batch_invariant() is on: row-blocked for CPU tensors, F.linear itself elsewhere."""
    if input.device.type != "cpu":
        return _LINEAR(input, weight, bias)
    return row_blocked_linear(input, weight, bias)


_depth = 0
_off = 0  # depth of `as_on_gpu()`


@contextlib.contextmanager
def batch_invariant() -> Iterator[None]:
    """For the duration, F.linear on CPU tensors runs in blocks of ROW_BLOCK rows (row_blocked_linear): nn.Linear
    and every caller of torch.nn.functional.linear (the policies, peft, transformers) find it there. The name is
    rebound rather than every torch call intercepted (a TorchFunctionMode: +18% on a toy +Fix step, measured);
    process-wide while on, as torch's own defaults are; nested uses are fine. Inside `as_on_gpu()` it does nothing."""
    global _depth
    if _off:
        yield
        return
    _depth += 1
    F.linear = _linear
    try:
        yield
    finally:
        _depth -= 1
        if not _depth:
            F.linear = _LINEAR


@contextlib.contextmanager
def as_on_gpu() -> Iterator[None]:
    """For the duration, `batch_invariant()` does nothing, as it does for CUDA tensors: code that emulates a GPU step
    on CPU tensors (margrpo plan) takes F.linear's own path, as the GPU would."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


def batch_invariant_active() -> bool:
    """Whether the calling code runs inside `batch_invariant()` (a checkpointed block recomputes in it too)."""
    return _depth > 0
