"""The MAR policy interface every model implements (design.md §2).

A masked autoregressive generator with a diffusion head factors into an AR model that maps the
currently known tokens to a conditioning vector z per position, and a small head that denoises a
token given z. GRPO, rollout and evaluation only talk to this interface, so one trainer serves the
toy models, NOVA and Harmon alike.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from margrpo.diffusion import Sampler
from margrpo.policy.invariant import batch_invariant


@dataclass
class TextCondition:
    """Encoded prompts: hidden states [B, Lt, W], a key-padding mask [B, Lt] (True = real token), and
    optionally `context` [B, ...]: what the policy derives from the prompt alone (NOVA: the frame
    condition), computed once per prompt by `MARPolicy.prepare_condition` instead of once per AR step."""

    hidden: Tensor
    mask: Tensor
    context: Tensor | None = None

    def __len__(self) -> int:
        return self.hidden.shape[0]

    def _map(self, fn) -> TextCondition:
        return TextCondition(fn(self.hidden), fn(self.mask), None if self.context is None else fn(self.context))

    def index(self, idx: Tensor | slice) -> TextCondition:
        return self._map(lambda t: t[idx])

    def repeat(self, n: int) -> TextCondition:
        """Repeat every row n times consecutively (prompt p -> rows p*n .. p*n+n-1, the GRPO group layout)."""
        return self._map(lambda t: t.repeat_interleave(n, 0))

    def tile(self, n: int) -> TextCondition:
        """The whole batch n times over (row b -> rows b, B + b, ...): one copy per replayed AR step."""
        return self._map(lambda t: t.repeat(n, *([1] * (t.dim() - 1))))

    @staticmethod
    def cat(conds: list[TextCondition]) -> TextCondition:
        """Concatenate along the batch, padding the text length to the longest (contexts kept if all have one)."""
        length = max(c.hidden.shape[1] for c in conds)
        hidden, mask = [], []
        for c in conds:
            pad = length - c.hidden.shape[1]
            hidden.append(nn.functional.pad(c.hidden, (0, 0, 0, pad)))
            mask.append(nn.functional.pad(c.mask, (0, pad), value=False))
        contexts = [c.context for c in conds]
        context = None if any(x is None for x in contexts) else torch.cat(contexts)
        return TextCondition(torch.cat(hidden), torch.cat(mask), context)


class MARPolicy(nn.Module, ABC):
    """Interface of a MAR policy. Shapes: L tokens of D channels per image; z has `z_dim` channels."""

    seq_len: int
    token_dim: int
    z_dim: int
    head_type: str  # "flow" or "ddpm": which sampler the head was trained for
    # How the cosine mask schedule turns L cos(pi/2 (k+1)/K) into a token count: "floor" (MAR's
    # mask_by_order, also Harmon) or "round" (NOVA's pipeline). See rollout.unknown_after_steps.
    mask_rounding: str = "floor"

    # --- conditioning -------------------------------------------------------------------------
    @abstractmethod
    def encode_prompts(self, prompts: list[str]) -> TextCondition: ...

    def prepare_condition(self, cond: TextCondition) -> TextCondition:
        """Attach what `ar_forward` needs from the prompt alone (`TextCondition.context`), so a rollout
        computes it once per prompt rather than once per AR step. Default: nothing to precompute."""
        return cond

    def null_condition(self, batch: int) -> TextCondition:
        """The unconditional branch of classifier-free guidance."""
        return self.encode_prompts([self.null_prompt] * batch)

    null_prompt: str = ""

    # --- the two halves -----------------------------------------------------------------------
    @abstractmethod
    def ar_forward(self, tokens: Tensor, known_mask: Tensor, cond: TextCondition) -> Tensor:
        """z [B, L, z_dim] for every position, given the known tokens [B, L, D] (mask [B, L], True = known)."""

    @abstractmethod
    def head(self, x_t: Tensor, t: Tensor, z: Tensor) -> Tensor:
        """Diffusion-head output [N, D * sampler.out_channels_factor] for noisy tokens [N, D] at model time t [N]."""

    # --- latent codec -------------------------------------------------------------------------
    @abstractmethod
    def encode(self, images: Tensor) -> Tensor:
        """Images [B, 3, H, W] in [0, 1] -> tokens [B, L, D]."""

    @abstractmethod
    def decode(self, tokens: Tensor) -> Tensor:
        """Tokens [B, L, D] -> images [B, 3, H, W] in [0, 1]."""

    @property
    @abstractmethod
    def token_grid(self) -> tuple[int, int]:
        """(rows, cols) of the token layout, for uncertainty maps."""

    # --- sampling -----------------------------------------------------------------------------
    @abstractmethod
    def make_sampler(self, num_steps: int, noise_level: float = 0.7) -> Sampler:
        """The head's stochastic sampler with T = num_steps steps (same noise schedule as training)."""

    # --- parameter groups ("+Fix" freezes the head) --------------------------------------------
    @abstractmethod
    def ar_parameters(self) -> Iterator[nn.Parameter]: ...

    @abstractmethod
    def head_parameters(self) -> Iterator[nn.Parameter]: ...

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # --- memory levers (policy.checkpointing, policy.lora; off by default) ------------------------------
    gradient_checkpointing: bool = False
    lora_scope: str | None = None  # regex: the module-name prefix of the AR transformer's blocks LoRA adapts
    lora_targets: tuple[str, ...] = ()  # default LoRA target_modules: leaf names of Linear layers in that scope

    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute the AR transformer's block activations in backward instead of keeping them."""
        raise NotImplementedError(f"{type(self).__name__} does not support gradient checkpointing")


@contextlib.contextmanager
def deterministic(module: nn.Module):
    """Eval mode (dropout off) and batch-invariant matrix products (`invariant.batch_invariant`) for the
    duration, restoring each submodule's flag afterwards.

    Rollouts and their log-prob recomputation both run inside this, so a policy left in train
    mode cannot break the ratio == 1 invariant (design.md §3.2), nor can the other batch shapes in which
    the replay meets the rollout's rows (their products would take other kernel paths on CPU).
    """
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with batch_invariant():
            yield module
    finally:
        for m, flag in flags:
            m.training = flag
