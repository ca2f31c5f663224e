"""The sampler of a one-step generator head (a MARVAL-distilled student, `margrpo.related.marval`).

The head maps (noise, z) to a token in one call; the step adds Gaussian noise of a fixed std, so
the step is a Gaussian policy with an exact log-probability and the GRPO trainer and rollout run on
it unchanged (|T| = 1):

    x = g(eps_0, z) + std * eps,   log p(x | eps_0, z) = sum_d log N(x_d; g_d, std^2)   (paper Eq. 12)

The rollout sizes its record by `SamplingConfig.diffusion_steps`, which must be >= 2, so the sampler
accepts num_steps >= 1: step 0 is the generation, every later step a *hold* step that returns its
input unchanged (deterministic, no log-prob; its model time is 0, where the toy head skips the MLP).
Use diffusion_steps = 2: one generation step, one free hold step, and stochastic_steps() = 1.
It implements the sampling half of the `Sampler` protocol; the training half (add_noise,
training_loss) belongs to denoisers: a one-step head is trained by distillation (`margrpo.related.marval`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from margrpo.diffusion.common import (
    SamplerStepOutput,
    StepIndex,
    check_model_output,
    check_step_index,
    check_temperature,
    expand_std,
    gaussian_step,
    init_noise,
)

GENERATION_TIME = 1000.0  # the model time of step 0: the student reads pure noise, as the teacher head at t = 1


@dataclass(frozen=True)
class OneStepConfig:
    """Configuration of a `OneStepSampler`."""

    num_steps: int = 2  # 1 generation step + hold steps (the rollout needs diffusion_steps >= 2)
    std: float = 0.05  # std of the generation step's Gaussian, in token units; the exploration noise of GRPO

    def __post_init__(self) -> None:
        if not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(f"num_steps must be an int >= 1, got {self.num_steps!r}")
        if not math.isfinite(self.std) or self.std <= 0:
            raise ValueError(f"std must be finite and > 0 (the step needs a log-prob), got {self.std!r}")


class OneStepSampler:
    """x = model_output + std * eps at step 0; hold steps after it. `OneStepSampler(std=0.05)`."""

    def __init__(self, config: OneStepConfig | None = None, **overrides) -> None:
        self.config = dataclasses.replace(config or OneStepConfig(), **overrides)
        self.num_steps = self.config.num_steps
        self.out_channels_factor = 1

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"

    def model_time(self, step_index: StepIndex) -> Tensor:
        """GENERATION_TIME at step 0, 0 at hold steps. 0-dim for an int, else [N]."""
        step_index = check_step_index(step_index, self.num_steps)
        return torch.where(torch.as_tensor(step_index) == 0, GENERATION_TIME, 0.0).float()

    def is_stochastic(self, step_index: StepIndex) -> Tensor:
        """True at step 0 only. Bool, shape of step_index."""
        step_index = check_step_index(step_index, self.num_steps)
        return torch.as_tensor(step_index) == 0

    init_noise = staticmethod(init_noise)  # the generator's input noise eps_0 ~ N(0, I)

    def step(
        self,
        model_output: Tensor,
        step_index: StepIndex,
        sample: Tensor,
        *,
        generator: torch.Generator | None = None,
        temperature: float = 1.0,
        prev_sample: Tensor | None = None,
        variance_noise: Tensor | None = None,
    ) -> SamplerStepOutput:
        """Step 0: draw (or score) x ~ N(model_output, (std * temperature)^2 I). Hold step: x = sample.

        model_output: [N, D] the generated token g(eps_0, z); sample: [N, D] eps_0 (step 0) or the token.
        """
        # 1. Validate; the mean is the head's token at generation rows, the input itself at hold rows.
        step_index = check_step_index(step_index, self.num_steps, batch=sample.shape[0])
        temperature = check_temperature(temperature)
        check_model_output(model_output, sample, 1, "generated token")
        stochastic = self.is_stochastic(step_index).to(sample.device)  # 0-dim or [N]
        rows = stochastic.view(-1, *([1] * (sample.dim() - 1)))
        mean = torch.where(rows, model_output.float(), sample.float())  # [N, D]

        # 2. std * temperature at generation rows, 0 at hold rows.
        std = expand_std(torch.where(rows, self.config.std * temperature, 0.0).float(), sample)  # [N, 1]

        # 3. Draw (or score the given) x and its log-probability; the clean estimate is the mean itself.
        return gaussian_step(
            mean,
            std,
            mean,
            step_index,
            stochastic,
            sample_dtype=sample.dtype,
            generator=generator,
            prev_sample=prev_sample,
            variance_noise=variance_noise,
        )
