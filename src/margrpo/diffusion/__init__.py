"""Stochastic samplers of the diffusion head with exact per-step log-probabilities (design.md §3.1).

Two processes behind one interface (`Sampler`): `DDPMSampler` (MAR / Harmon: eps or v prediction,
fixed or learned-range variance, respaced) and `FlowSDESampler` (NOVA: flow matching with the
Flow-GRPO SDE step), plus `OneStepSampler` for one-step generator heads (MARVAL students). Build one by
name with `build_sampler("ddpm", num_steps=25)`.
Layer 1 (see margrpo/__init__.py): it must not import prompts, policy, rewards, grpo, toylab, related,
evaluation, reporting, experiment, stages, plan, cli.
"""

from __future__ import annotations

from margrpo.diffusion.common import Sampler, SamplerStepOutput, StepIndex, gaussian_log_prob
from margrpo.diffusion.ddpm import DDPMConfig, DDPMSampler
from margrpo.diffusion.flow import FlowConfig, FlowSDESampler
from margrpo.diffusion.one_step import OneStepConfig, OneStepSampler

SAMPLERS: dict[str, type] = {"ddpm": DDPMSampler, "flow": FlowSDESampler, "one_step": OneStepSampler}


def build_sampler(kind: str, **config) -> Sampler:
    """The sampler registered under `kind` ("ddpm" or "flow"), configured by keyword (its config's fields)."""
    if kind not in SAMPLERS:
        raise ValueError(f"Unknown sampler kind: {kind!r}; expected one of {tuple(SAMPLERS)}")
    return SAMPLERS[kind](**config)


__all__ = [
    "SAMPLERS",
    "DDPMConfig",
    "DDPMSampler",
    "FlowConfig",
    "FlowSDESampler",
    "OneStepConfig",
    "OneStepSampler",
    "Sampler",
    "SamplerStepOutput",
    "StepIndex",
    "build_sampler",
    "gaussian_log_prob",
]
