"""CUDA's autocast policy applied to CPU tensors, switched in where the trainer opens its CPU autocast: the plan
counts the dtypes a GPU step makes (matmuls in bf16; norms, softmax, exp, log, pow and the like in fp32), not the
CPU's (which keeps norms and softmax in bf16)."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map_only


def _fns(*names: str) -> set:
    """torch functions and Tensor methods by name (those that exist)."""
    F = torch.nn.functional
    return {getattr(owner, n) for n in names for owner in (torch, torch.Tensor, F, torch.linalg) if hasattr(owner, n)}


# aten/src/ATen/autocast_mode.cpp, the CUDA lists (the promote list is left to type promotion)
LOW = _fns(
    "linear",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "prelu",
    "scaled_dot_product_attention",
    "matmul",
    "__matmul__",
    "__rmatmul__",
    "mm",
    "bmm",
    "baddbmm",
    "addmm",
    "addbmm",
    "mv",
    "addmv",
    "addr",
    "einsum",
    "chain_matmul",
    "multi_dot",
    "vecdot",
)
FP32 = _fns(
    "layer_norm",
    "group_norm",
    "softplus",
    "cosine_similarity",
    "interpolate",
    "exp",
    "expm1",
    "log",
    "log2",
    "log10",
    "log1p",
    "reciprocal",
    "rsqrt",
    "acos",
    "asin",
    "cosh",
    "sinh",
    "tan",
    "erfinv",
    "pow",
    "__pow__",
    "__rpow__",
    "logsumexp",
    "mse_loss",
    "l1_loss",
    "smooth_l1_loss",
    "huber_loss",
    "kl_div",
    "nll_loss",
    "binary_cross_entropy_with_logits",
    "cdist",
    "dist",
    "renorm",
    "pdist",
)
FP32_OUT = _fns("softmax", "log_softmax", "sum", "cumsum", "prod", "cumprod", "vector_norm", "matrix_norm")
AUTOCAST = LOW | FP32 | FP32_OUT


class CudaAutocast(TorchFunctionMode):
    """Where CPU autocast is on (the trainer's regions), apply CUDA's policy instead of the CPU's, with its cache of
    the low-precision copies of leaf weights that require grad (kept until the region ends: `clear`)."""

    def __init__(self):
        super().__init__()
        self.cache: dict[int, torch.Tensor] = {}

    def cast(self, x, dtype: torch.dtype, cache: bool):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dtype in (dtype, torch.float64):
            return x
        if cache and x.dtype == torch.float32 and x.requires_grad and x.is_leaf and not x._is_view():
            if id(x) not in self.cache:
                self.cache[id(x)] = x.to(dtype)
            return self.cache[id(x)]
        return x.to(dtype)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in AUTOCAST or not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        low = torch.get_autocast_dtype("cpu")
        if func in LOW or func in FP32:
            dtype = low if func in LOW else torch.float32
            args, kwargs = tree_map_only(torch.Tensor, lambda x: self.cast(x, dtype, func in LOW), (args, kwargs))
        elif (
            "dtype" not in kwargs
            and isinstance(args[0], torch.Tensor)
            and args[0].is_floating_point()
            and args[0].dtype != torch.float64
        ):
            kwargs = {**kwargs, "dtype": torch.float32}
        with torch.autocast("cpu", enabled=False):
            return func(*args, **kwargs)

    def clear(self) -> None:
        self.cache.clear()
