"""MaskGIT-style generation for the discrete toy-mask policy, recording what GRPO needs.

Start from an all-[MASK] canvas; at step k the model gives a categorical over the codebook at every
position (with classifier-free guidance on the logits and a temperature), one token is drawn at every
masked position, and n_k of them are committed, n_k following the cosine schedule the continuous
rollout uses (`unknown_after_steps`, MAR's floor rounding). The rest are discarded and redrawn later.

Which positions are committed (`selection`):
- "random" (default): uniformly among the masked positions, independently of the model. Then the
  probability of a trajectory is the product of the committed tokens' categorical probabilities times
  a factor free of the parameters, so the committed-token log-probs are the exact policy log-probs.
- "confidence": MaskGIT's rule, the most confident draws with annealed Gumbel noise. Better samples
  from a weak model, but the choice then depends on the parameters, and the committed-token log-probs
  leave that choice's probability out (as every MaskGIT-GRPO does); the record is the same.

The record holds, per step, which positions were masked (the state the step saw: final tokens where
known, [MASK] elsewhere), every drawn token and its log-prob, and which were committed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from margrpo.grpo.rollout import unknown_after_steps
from margrpo.policy.base import deterministic
from margrpo.related.maskgrpo.policy import ToyMaskPolicy

SELECTIONS = ("random", "confidence")


@dataclass
class MaskSamplingConfig:
    steps: int = 8  # K unmasking steps over the 16 cells (cosine schedule)
    temperature: float = 1.0  # of the categorical the tokens are drawn from (and scored under)
    cfg_scale: float = 2.0  # guidance on the logits, u + s (c - u); 1 = conditional only
    selection: str = "random"  # which drawn tokens are committed: "random" or "confidence" (MaskGIT)
    gumbel_scale: float = 4.5  # MaskGIT's choice temperature, annealed linearly to 0 ("confidence" only)

    def __post_init__(self):
        if self.selection not in SELECTIONS:
            raise ValueError(
                f"Unknown selection: {self.selection!r}; expected one of {', '.join(map(repr, SELECTIONS))}"
            )
        if self.steps < 1 or not self.temperature > 0:
            raise ValueError(f"steps must be >= 1 and temperature > 0, got {self.steps}, {self.temperature}")


@dataclass
class MaskStepOutput:
    tokens: Tensor  # [B, L] the state after the step: committed tokens written, the rest still [MASK]
    sampled: Tensor  # [B, L] the token drawn at every position (kept only where committed)
    committed: Tensor  # [B, L] bool
    log_prob: Tensor  # [B, L] float32 log-prob of `sampled` under the step's categorical


class MaskGITSampler:
    """One unmasking step at a time, diffusers-scheduler style; the schedule is fixed at construction."""

    def __init__(self, seq_len: int, config: MaskSamplingConfig):
        self.config, self.seq_len = config, seq_len
        self.unknown_after = unknown_after_steps(seq_len, config.steps, "floor")  # tokens left masked after each step

    def log_probs(self, logits: Tensor) -> Tensor:
        """The step's categorical as log-probs [..., V] (float32): logits over the temperature."""
        return torch.log_softmax(logits.float() / self.config.temperature, dim=-1)

    def step(
        self, k: int, logits: Tensor, tokens: Tensor, mask_id: int, generator: torch.Generator | None = None
    ) -> MaskStepOutput:
        B, L, V = logits.shape
        # 1. the categorical at every position, and one draw from it
        logp = self.log_probs(logits)  # [B, L, V]
        sampled = (
            torch.multinomial(logp.exp().reshape(B * L, V).cpu(), 1, generator=generator).view(B, L).to(tokens.device)
        )
        lp = logp.gather(-1, sampled[..., None]).squeeze(-1)  # [B, L]
        # 2. which masked positions to commit: n = (masked now) - (masked after this step), same for every row
        masked = tokens == mask_id
        n = int(masked[0].sum()) - self.unknown_after[k]
        noise = torch.rand(B, L, generator=generator).to(tokens.device)
        if self.config.selection == "random":
            score = noise
        else:  # confidence + annealed Gumbel noise (MaskGIT)
            anneal = self.config.gumbel_scale * (1 - (k + 1) / self.config.steps)
            score = lp - anneal * torch.log(-torch.log(noise.clamp(1e-20, 1 - 1e-7)))
        score = score.masked_fill(~masked, float("-inf"))
        committed = torch.zeros_like(masked).scatter_(1, score.topk(n, dim=1).indices, True)
        return MaskStepOutput(torch.where(committed, sampled, tokens), sampled, committed, lp)


@dataclass
class MaskRollout:
    """Everything a discrete generation decided. N images, K steps, L tokens."""

    prompts: list[str]  # [N] (prompt p repeated group_size times, consecutively)
    tokens: Tensor  # [N, L] final tokens
    images: Tensor  # [N, 3, H, W] in [0, 1]
    masked: Tensor  # [K, N, L] bool: still [MASK] when step k ran (the state step k saw)
    committed: Tensor  # [K, N, L] bool: committed at step k (the committed token is the final one)
    sampled: Tensor  # [K, N, L] long: the token step k drew at every masked position
    log_probs: Tensor  # [K, N, L] float32: log-prob of the drawn token under step k's categorical
    sampling: MaskSamplingConfig


def conditions(policy: ToyMaskPolicy, prompts: list[str], sampling: MaskSamplingConfig):
    """(cond, uncond or None) for these prompts under the sampling's guidance."""
    cond = policy.encode_prompts(prompts)
    return cond, (policy.null_condition(len(prompts)) if sampling.cfg_scale != 1.0 else None)


@torch.no_grad()
def generate(
    policy: ToyMaskPolicy,
    prompts: list[str],
    sampling: MaskSamplingConfig,
    group_size: int = 1,
    generator: torch.Generator | None = None,
) -> MaskRollout:
    """Generate `group_size` images per prompt (prompt-major) and record the trajectory."""
    with deterministic(policy):
        prompts = [p for p in prompts for _ in range(group_size)]
        cond, uncond = conditions(policy, prompts, sampling)
        sampler = MaskGITSampler(policy.seq_len, sampling)
        tokens = torch.full((len(prompts), policy.seq_len), policy.mask_id, dtype=torch.long, device=policy.device)
        masked, committed, sampled, log_probs = [], [], [], []
        for k in range(sampling.steps):
            masked.append(tokens == policy.mask_id)
            out = sampler.step(
                k, policy.guided_logits(tokens, cond, uncond, sampling.cfg_scale), tokens, policy.mask_id, generator
            )
            tokens = out.tokens
            committed.append(out.committed), sampled.append(out.sampled), log_probs.append(out.log_prob)
        return MaskRollout(
            prompts,
            tokens,
            policy.decode(tokens),
            torch.stack(masked),
            torch.stack(committed),
            torch.stack(sampled),
            torch.stack(log_probs),
            sampling,
        )
