"""The ledger: a dispatch mode that adds up the live tensor storages' bytes by kind and keeps each phase's peak,
on fake tensors (the plan) and real ones alike (the validation compares the two)."""

from __future__ import annotations

import time
import weakref
from collections import Counter
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map_only

GiB = 2**30
_verbose = False


def say_phases(on: bool) -> None:
    """Print each phase's peak as it ends (the full-size steps take minutes): `margrpo plan` turns it on."""
    global _verbose
    _verbose = on


def saying_phases() -> bool:
    return _verbose


def _storages(t: torch.Tensor) -> list:
    return [t.untyped_storage()] if t.layout == torch.strided and not t.is_nested else []


CASTS = {torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout}


class Ledger(TorchDispatchMode):
    """Bytes of the live tensor storages by kind and each phase's peak with its split by kind (fake or real tensors:
    the same code counts both, which is what the small-size validation compares)."""

    def __init__(self):
        super().__init__()
        self.info: dict[int, list] = {}  # id(storage) -> [bytes, kind, weakref]
        self.now: Counter = Counter()
        self.phase, self.default = "setup", "act"
        self.peaks: dict[str, tuple[int, dict]] = {}
        self.weights: set[int] = set()  # storages of weights (autocast's copies of them are "cast")
        self.t0 = time.perf_counter()

    def total(self) -> int:
        return sum(self.now.values())

    def track(self, t: torch.Tensor, kind: str, retag: bool = False) -> None:
        for st in _storages(t):
            entry = self.info.get(id(st))
            if entry is None:
                entry = [st.nbytes(), kind, None]
                entry[2] = weakref.ref(st, partial(self._free, id(st)))
                self.info[id(st)] = entry
                self.now[kind] += entry[0]
            elif retag and entry[1] != kind:
                self.now[entry[1]] -= entry[0]
                self.now[kind] += entry[0]
                entry[1] = kind

    def _free(self, key: int, _ref) -> None:
        entry = self.info.pop(key, None)
        if entry is not None:
            self.now[entry[1]] -= entry[0]

    def retag(self, tensors, kind: str) -> None:
        for t in tree_leaves(tensors):
            if isinstance(t, torch.Tensor):
                self.track(t, kind, retag=True)

    def phantom(self, kind: str, nbytes: int) -> None:
        """Bytes no tensor holds here but the real step does (the AR steps a shortened rollout skipped)."""
        self.now[kind] += nbytes
        self.note()

    def set_phase(self, phase: str, default: str = "act") -> None:
        if _verbose and self.phase in ("rollout", "replay", "optimizer"):
            print(
                f"      {self.phase}: peak {self.peaks[self.phase][0] / GiB:.2f} GiB "
                f"({time.perf_counter() - self.t0:.0f} s)",
                flush=True,
            )
        self.phase, self.default = phase, default
        self.note()

    def note(self) -> None:
        total = self.total()
        if total > self.peaks.get(self.phase, (-1,))[0]:
            self.peaks[self.phase] = (total, {k: v for k, v in self.now.items() if v})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        kind = self.default
        if func in CASTS and isinstance(args[0], torch.Tensor) and id(args[0].untyped_storage()) in self.weights:
            kind = "cast"
        tree_map_only(torch.Tensor, lambda t: self.track(t, kind), out)
        self.note()
        return out
