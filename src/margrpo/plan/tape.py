"""The tape: the results of a step's data-dependent ops (`.item()`, `nonzero`, a boolean index, `tolist`), recorded
on a real run of the policy's narrow twin and replayed, in order and checked, on the fake full-size step, where
they have no value."""

from __future__ import annotations

import contextlib
from collections import deque

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from margrpo.policy.checkpointing import recomputing_under

INDEX_OPS = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put.default,
    torch.ops.aten.index_put_.default,
    torch.ops.aten._index_put_impl_.default,
}
DYNAMIC = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)
_DYNAMIC: dict = {}  # op -> whether it is tagged DYNAMIC


def _bool_indices(func, args) -> list[int]:
    return (
        [i for i, x in enumerate(args[1]) if isinstance(x, torch.Tensor) and x.dtype == torch.bool]
        if func in INDEX_OPS
        else []
    )


class Tape(TorchDispatchMode):
    """Records (`values` None) or replays the results of the data-dependent ops of a step, in order."""

    def __init__(self, values: list | None = None):
        super().__init__()
        self.recording = values is None
        self.values = [] if values is None else values
        self.queue = deque(self.values)

    def pop(self, name: str):
        if not self.queue:
            raise RuntimeError(f"tape: {name} has no recorded result (the fake step took another path)")
        got, value = self.queue.popleft()
        if got != name:
            raise RuntimeError(f"tape: {name} where {got} was recorded (the fake step took another path)")
        return value

    @staticmethod
    def kind(x) -> str:
        """A scalar's kind, checked on replay (a misaligned tape hands out a loss where a step count was read)."""
        return "bool" if x.dtype == torch.bool else "float" if x.is_floating_point() else "int"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dynamic = _DYNAMIC.get(func)
        if dynamic is None:
            dynamic = _DYNAMIC[func] = any(t in func.tags for t in DYNAMIC)
        bools = _bool_indices(func, args) if dynamic else []
        if not dynamic or func in INDEX_OPS and not bools:
            return func(*args, **kwargs)
        name = str(func)
        if self.recording:
            if bools:  # the count of each boolean index
                self.values.append((name, [int(args[1][i].sum()) for i in bools]))
                return func(*args, **kwargs)
            out = func(*args, **kwargs)
            if func is torch.ops.aten._local_scalar_dense.default:
                self.values.append((name, (self.kind(args[0]), out)))
            else:
                self.values.append(
                    (name, [(tuple(t.shape), t.dtype) for t in tree_leaves(out) if isinstance(t, torch.Tensor)])
                )
            return out
        value = self.pop(name)
        if func is torch.ops.aten._local_scalar_dense.default:
            if value[0] != self.kind(args[0]):
                raise RuntimeError(f"tape: a {self.kind(args[0])} read where a {value[0]} was recorded (another path)")
            return value[1]
        if bools:  # each boolean index becomes its count of (zero) long indices, one per dimension it spans
            indices = []
            for i, x in enumerate(args[1]):
                if i in bools:
                    n = value[bools.index(i)]
                    indices += [torch.zeros(n, dtype=torch.long, device=x.device)] * x.dim()
                else:
                    indices.append(x)
            return func(args[0], indices, *args[2:], **kwargs)
        outs = [torch.zeros(shape, dtype=dtype, device=args[0].device) for shape, dtype in value]
        if func in (torch.ops.aten.nonzero.default, torch.ops.aten.masked_select.default) and len(outs) == 1:
            return outs[0]
        if func is torch.ops.aten._unique2.default:
            return tuple(outs)
        raise RuntimeError(f"tape: no replay rule for {name}")


def _items(t: torch.Tensor):
    return t.item() if t.dim() == 0 else [_items(e) for e in t]


def _cheap_attention(q, k, v, *args, **kwargs):
    return q + 0 * (k.mean() + v.mean())


class Recording(TorchFunctionMode):
    """While a real run records the tape: `Tensor.tolist` (which reads memory without dispatching) takes one `.item()`
    per element, as a fake tensor's `tolist` does, so both steps put the same entries on the tape. `cheap` (the narrow
    run): attention is q + 0 (k, v), which keeps every gradient: attention decides nothing data-dependent, and its
    S^2 work at 1,000+ positions is what made that run slow."""

    def __init__(self, cheap: bool):
        super().__init__()
        self.cheap = cheap

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.tolist:
            return _items(*args)
        if func is F.scaled_dot_product_attention and self.cheap:
            return _cheap_attention(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def recording(cheap: bool):
    """A `Recording` for the block, and again where run_blocks recomputes a checkpointed block in backward
    (`checkpointing.recomputing_under`): a mode sees no call made inside a call it handles, and backward is one.
    Transformers' own checkpointing (Harmon's LLM) recomputes elsewhere: its attention is given the stand-in where
    the model looks it up (`stand_in_attention`)."""
    mode = Recording(cheap)
    with mode, recomputing_under(mode):
        yield


STAND_IN = "margrpo_plan_sdpa"


def _stand_in_sdpa(module, *args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    with Recording(cheap=True):
        return sdpa_attention_forward(module, *args, **kwargs)


def stand_in_attention(policy) -> None:
    """The narrow run's attention in the transformers models inside `policy` (NOVA's Phi, Harmon's LLM), also where
    transformers recomputes a checkpointed layer: their `sdpa` under a `Recording` of its own, through the attention
    implementations transformers lets one register (with sdpa's masks)."""
    from transformers import AttentionInterface, PreTrainedModel
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(STAND_IN, _stand_in_sdpa)
    AttentionMaskInterface.register(STAND_IN, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    for m in policy.modules():
        if isinstance(m, PreTrainedModel) and m.config._attn_implementation == "sdpa":
            m.set_attn_implementation(STAND_IN)
            if m.config._attn_implementation != STAND_IN:
                raise RuntimeError(f"{type(m).__name__} kept its attention {m.config._attn_implementation!r}")
