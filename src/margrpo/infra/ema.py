"""The exponential moving average of a module's weights that evaluation and the saved policies use."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager

import torch


class EMA:
    """Exponential moving average of a module's state (or of the entries `names`: what RL trains), kept
    in float32 so that a decay near 1 still moves it; evaluation and the saved policy use it.

    Named entries are read off the module's parameters and buffers, not its state_dict: LoRA's
    state-dict hook hides the adapters (policy.lora), and the adapters are what RL trains then."""

    def __init__(self, module: torch.nn.Module, decay: float, names: Iterable[str] | None = None):
        self.decay, self.names = decay, None if names is None else list(names)
        state = self._tensors(module)
        self.shadow = {k: _master(state[k]) for k in (state if names is None else self.names)}

    def _tensors(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        if self.names is None:
            return module.state_dict()
        return {**dict(module.named_buffers()), **dict(module.named_parameters())}

    def tracked(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """A copy of the module's own values of the averaged entries (the raw weights RL goes on from)."""
        state = self._tensors(module)
        return {k: state[k].detach().clone() for k in self.shadow}

    @torch.no_grad()
    def assign(self, module: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
        """Write `values` (averaged entries by name) into the module."""
        if self.names is None:
            module.load_state_dict(values)
            return
        state = self._tensors(module)
        for k, v in values.items():
            state[k].copy_(v)

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        state = self._tensors(module)
        for k, s in self.shadow.items():
            if s.dtype.is_floating_point:
                s.lerp_(state[k].detach().float(), 1 - self.decay)
            else:
                s.copy_(state[k])

    def copy_to(self, module: torch.nn.Module) -> None:
        self.assign(module, self.shadow)

    @contextmanager
    def applied(self, module: torch.nn.Module):
        """The module holds the average inside the block and its own weights again after it."""
        raw = self.tracked(module)
        self.copy_to(module)
        try:
            yield module
        finally:
            self.assign(module, raw)


def _master(v: torch.Tensor) -> torch.Tensor:
    return v.detach().float().clone() if v.dtype.is_floating_point else v.detach().clone()
