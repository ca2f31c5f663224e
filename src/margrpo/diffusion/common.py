"""Shared pieces of the samplers: the step output, the sampler protocol, and the Gaussian step tail.

Every stochastic reverse step of both processes has the form

    x_{t-1} ~ N(mean, std^2 I),   log p(x_{t-1} | x_t, z) = sum_d log N(x_{t-1,d}; mean_d, std_d^2)

(paper Eq. 12). Each sampler computes `mean`, `std` and the clean estimate `pred_x0` from the head
output; `gaussian_step` below draws or scores `x_{t-1}` the same way for both, so that the rollout
log-probability and the recomputed one go through the very same float32 arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

StepIndex = int | Tensor
"""A sampling step 0..T-1 (0 = noisiest): one int for every row, or a LongTensor [N], one per row."""

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class SamplerStepOutput:
    """What one reverse step returns (shapes for a sample of shape [N, D])."""

    prev_sample: Tensor  # [N, D] x_{t-1}, in the dtype of the input sample
    log_prob: Tensor | None  # [N] float32, sum over D of the Gaussian log density; None on the final step
    mean: Tensor  # [N, D] float32 mean of the step's Gaussian
    std: Tensor  # [N, 1] or [N, D] float32 (broadcastable), includes temperature; 0 on final-step rows
    pred_x0: Tensor  # [N, D] float32 clean-sample estimate at this step (for the Sim consistency mask)


@runtime_checkable
class Sampler(Protocol):
    """The interface both `DDPMSampler` and `FlowSDESampler` implement; callers never branch on which."""

    num_steps: int  # T sampling steps
    out_channels_factor: int  # 1, or 2 when the head also predicts a variance (DDPM learned_range)

    def model_time(self, step_index: StepIndex) -> Tensor: ...

    def is_stochastic(self, step_index: StepIndex) -> Tensor: ...

    def init_noise(
        self,
        shape: tuple[int, ...],
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> Tensor: ...

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
    ) -> SamplerStepOutput: ...

    def sample_train_time(
        self, n: int, generator: torch.Generator | None = None, device: torch.device | str | None = None
    ) -> Tensor: ...

    def add_noise(self, x0: Tensor, noise: Tensor, train_time: Tensor) -> Tensor: ...

    def training_loss(
        self,
        model_output: Tensor,
        x0: Tensor,
        noise: Tensor,
        x_t: Tensor,
        train_time: Tensor,
        mse_weight: Tensor | float = 1.0,
    ) -> Tensor: ...

    def train_model_time(self, train_time: Tensor) -> Tensor: ...


# ----------------------------------------------------------------------------------------------
# helpers used by both samplers


def init_noise(
    shape: tuple[int, ...],
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The start of a reverse process, N(0, I), drawn in float32 and cast: the same draws for every dtype.

    Drawn where the generator lives (margrpo's are CPU generators) and moved: the same draws on every device."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(device=device, dtype=dtype)


def check_step_index(step_index: StepIndex, num_steps: int, batch: int | None = None) -> StepIndex:
    """Validate a step index; a 0-dim tensor becomes an int. Returns an int or a LongTensor [N]."""
    if isinstance(step_index, Tensor):
        if step_index.dim() == 0:
            step_index = int(step_index.item())
        else:
            if step_index.dtype.is_floating_point or step_index.dtype == torch.bool:
                raise ValueError(f"step_index must be an integer tensor, got dtype {step_index.dtype}")
            if step_index.dim() != 1 or (batch is not None and step_index.shape[0] != batch):
                raise ValueError(
                    f"step_index tensor must have shape [N] = [{batch}] (one step per row), "
                    f"got {tuple(step_index.shape)}"
                )
            if step_index.numel() and (int(step_index.min()) < 0 or int(step_index.max()) >= num_steps):
                raise ValueError(f"step_index values must lie in [0, {num_steps}); got {step_index.tolist()}")
            return step_index.long()
    if isinstance(step_index, bool) or not isinstance(step_index, int):
        raise ValueError(f"step_index must be an int or a LongTensor [N], got {type(step_index).__name__}")
    if not 0 <= step_index < num_steps:
        raise ValueError(f"step_index must lie in [0, {num_steps}) (0 = noisiest step), got {step_index}")
    return step_index


def gather_rows(table: Tensor, index: StepIndex, ndim: int, device: torch.device) -> Tensor:
    """table[index] as float32 on `device`, shaped to broadcast against a [N, ...] tensor of `ndim` dims.

    int index -> 0-dim tensor; LongTensor [N] -> [N, 1, ..., 1].
    """
    table = table.to(device=device, dtype=torch.float32)
    if isinstance(index, int):
        return table[index]
    values = table[index.to(device)]  # [N]
    return values.view(-1, *([1] * (ndim - 1)))


def check_temperature(temperature: float) -> float:
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(
            f"temperature must be a finite number > 0 (it scales the std of every stochastic step), "
            f"got {temperature!r}"
        )
    return float(temperature)


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """sum over the last dim of log N(x; mean, std^2), in float32. x, mean: [N, D]; std broadcastable."""
    x, mean, std = x.float(), mean.float(), std.float()
    log_density = -((x - mean) ** 2) / (2.0 * std**2) - torch.log(std) - _HALF_LOG_2PI  # [N, D]
    return log_density.sum(-1)  # [N]


def gaussian_step(
    mean: Tensor,
    std: Tensor,
    pred_x0: Tensor,
    step_index: StepIndex,
    stochastic: Tensor,
    *,
    sample_dtype: torch.dtype,
    generator: torch.Generator | None,
    prev_sample: Tensor | None,
    variance_noise: Tensor | None = None,
) -> SamplerStepOutput:
    """Draw x_{t-1} ~ N(mean, std^2 I) (or score a given one) and return the step output.

    mean, pred_x0: [N, D] float32; std: broadcastable float32, already multiplied by the temperature
    and 0 on final-step rows; stochastic: bool, 0-dim for an int step index or [N] per row.

    `variance_noise` [N, D] float32: the standard normal draw to use instead of one from `generator`
    (rows drawn from several generators can then take one step: the rollout batches its groups so).
    The log-probability is always evaluated on the *returned* prev_sample (after the cast to the
    sample dtype), so a later call with `prev_sample=` that tensor reproduces it bit for bit.
    """
    scalar_final = isinstance(step_index, int) and not bool(stochastic)

    # 1. x_{t-1}: drawn as mean + std * noise (float32 noise, then cast), or taken as given.
    if prev_sample is None:
        if scalar_final:
            prev_sample = mean.to(sample_dtype)  # deterministic final step: no noise drawn
        else:
            noise = (
                variance_noise
                if variance_noise is not None
                else torch.randn(mean.shape, generator=generator, dtype=torch.float32).to(mean.device)
            )
            if noise.shape != mean.shape:
                raise ValueError(
                    f"variance_noise must have the sample's shape {tuple(mean.shape)}, got {tuple(noise.shape)}"
                )
            prev_sample = (mean + std * noise).to(sample_dtype)  # rows with std == 0 get the mean
    elif prev_sample.shape != mean.shape:
        raise ValueError(
            f"prev_sample must have the sample's shape {tuple(mean.shape)}, got {tuple(prev_sample.shape)}"
        )

    # 2. log N(x_{t-1}; mean, std^2 I) summed over channels (paper Eq. 12); 0 for deterministic rows.
    if scalar_final:
        log_prob = None
    else:
        row_stochastic = stochastic.view(-1, *([1] * (mean.dim() - 1)))  # [N, 1, ...] or 0-dim
        safe_std = torch.where(row_stochastic, std, torch.ones_like(std))  # avoid log(0) on final rows
        log_prob = gaussian_log_prob(prev_sample, mean, safe_std)  # [N]
        log_prob = torch.where(stochastic.view(-1, *([1] * (log_prob.dim() - 1))), log_prob, 0.0)
    return SamplerStepOutput(prev_sample=prev_sample, log_prob=log_prob, mean=mean, std=std, pred_x0=pred_x0)


def expand_std(std: Tensor, sample: Tensor) -> Tensor:
    """Materialise a broadcastable std as [N, 1] (one std per row) or [N, D] (per channel)."""
    shape = torch.broadcast_shapes(std.shape, (*sample.shape[:-1], 1))
    return std.expand(shape).contiguous()


def check_model_output(model_output: Tensor, sample: Tensor, factor: int, what: str) -> None:
    """The head output must be [N, factor * D] for a sample [N, D]."""
    expected = (*sample.shape[:-1], factor * sample.shape[-1])
    if tuple(model_output.shape) != expected:
        raise ValueError(
            f"model_output must have shape {expected} for a sample of shape {tuple(sample.shape)} ({what}), "
            f"got {tuple(model_output.shape)}"
        )
