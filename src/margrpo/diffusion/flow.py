"""Flow-matching sampler with the Flow-GRPO SDE step (NOVA's diffusion head).

Process: x_t = (1 - t) x0 + t eps, t in [0, 1] (t = 1 pure noise); the head predicts the velocity
v = eps - x0, so the probability-flow ODE is dx/dt = v.

Reverse SDE with the same marginals (Flow-GRPO's ODE-to-SDE conversion, Liu et al. 2025). From x = (1 - t) x0 + t eps,
x0 = x - t v and eps = x + (1 - t) v, and the score is  grad log p_t(x) = -E[eps | x] / t
= -(x + (1 - t) v) / t. Any diffusion coefficient sigma_t gives the same marginals as the ODE with
the forward drift v + sigma_t^2 / 2 * score; run backwards in time (dt < 0) that is

    dx = [v + sigma_t^2 / (2 t) * (x + (1 - t) v)] dt + sigma_t dw,   sigma_t = a * sqrt(t / (1 - t)),

with a = `noise_level`. Euler-Maruyama on the grid t_0 = 1 > t_1 > ... > t_T = 0 gives the Gaussian step

    mean = x + [v + sigma_t^2 / (2 t) * (x + (1 - t) v)] * dt,   std = sigma_t * sqrt(-dt),   dt = t_{i+1} - t_i,

which is the Euler ODE step x + v dt for a = 0. The last step (to t = 0) is the deterministic Euler step.
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
    gather_rows,
    gaussian_step,
    init_noise,
)

TRAIN_TIME_SAMPLINGS = ("logit_normal", "uniform")


@dataclass(frozen=True)
class FlowConfig:
    """Configuration of a `FlowSDESampler`."""

    num_steps: int = 25  # T sampling steps (NOVA: 25)
    noise_level: float = 0.7  # a in sigma_t = a sqrt(t / (1 - t)) (Flow-GRPO, paper's NOVA runs: 0.7); 0 = ODE
    shift: float = 1.0  # time shift t' = s t / (1 + (s - 1) t) of the sampling grid (SD3); 1 = linear grid
    train_time_sampling: str = "logit_normal"  # training t: "logit_normal" (sigmoid of N(0, 1), SD3) or "uniform"
    # The last step t_{T-1} -> 0 draws noise too (sigma_t of t_{T-1}), so every step has a log-prob.
    # With a deterministic last step its dependence on the parameters is missing from the policy
    # gradient; for a head that predicts x0 that step *is* the token (x_0 = x0_hat(x_{t_{T-1}})), and
    # the likelihood-ratio estimate then pointed against the true gradient of E[R] (measured: docs/findings.md).
    stochastic_final: bool = False
    # The smallest training time of the scheduler, before shifting. 0: the grid is linspace(1, 0, T + 1), shifted.
    # NOVA's Euler scheduler uses 1 / num_train_timesteps = 0.001; see `shifted_time_grid` for its grid.
    t_min: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.num_steps, int) or self.num_steps < 1:
            raise ValueError(f"num_steps must be an int >= 1, got {self.num_steps!r}")
        if not 0 <= self.t_min < 1 or (self.t_min > 0 and self.num_steps < 2):
            raise ValueError(f"t_min must be in [0, 1) (and > 0 only with num_steps >= 2), got {self.t_min!r}")
        if not math.isfinite(self.noise_level) or self.noise_level < 0:
            raise ValueError(
                f"noise_level must be finite and >= 0 (0 gives the deterministic ODE), got {self.noise_level!r}"
            )
        if not math.isfinite(self.shift) or self.shift <= 0:
            raise ValueError(f"shift must be finite and > 0 (1 leaves the grid linear), got {self.shift!r}")
        if self.train_time_sampling not in TRAIN_TIME_SAMPLINGS:
            raise ValueError(
                f"Unknown train_time_sampling: {self.train_time_sampling!r}; expected one of {TRAIN_TIME_SAMPLINGS}"
            )


def shifted_time_grid(num_steps: int, shift: float, t_min: float = 0.0) -> Tensor:
    """t_0 = 1 > t_1 > ... > t_T = 0 under the time shift w(t) = s t / (1 + (s - 1) t) (SD3). [T+1] float64.

    t_min = 0: w(linspace(1, 0, T + 1)).
    t_min > 0: NOVA's FlowMatchEulerDiscreteScheduler (baaivision/NOVA diffnext/schedulers/scheduling_cfm.py).
    Its constructor shifts the training times 1/1000 ... 1, so its smallest one is w(t_min); `set_timesteps`
    spans linspace(1, w(t_min), T) and shifts that again, then appends 0. So the grid is
    w(linspace(1, w(t_min), T)) followed by 0: its last time before 0 is t_min shifted twice (0.00893 at s = 3,
    t_min = 0.001), and every interior time moves with it; at s = 1 both shifts are the identity.
    """

    def warp(t: Tensor) -> Tensor:
        return shift * t / (1 + (shift - 1) * t)

    if t_min > 0:
        end = warp(torch.tensor(t_min, dtype=torch.float64))  # the scheduler's sigma_min, shifted once
        t = torch.cat(
            [torch.linspace(1.0, float(end), num_steps, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)]
        )
    else:
        t = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    return warp(t)


class FlowSDESampler:
    """Flow-matching sampler whose steps are the Flow-GRPO SDE (or the Euler ODE for noise_level = 0).

    `FlowSDESampler(config)` or `FlowSDESampler(num_steps=10, noise_level=0.5)`.
    """

    def __init__(self, config: FlowConfig | None = None, **overrides) -> None:
        self.config = dataclasses.replace(config or FlowConfig(), **overrides)
        self.num_steps = self.config.num_steps
        self.out_channels_factor = 1
        self.sigmas = shifted_time_grid(
            self.num_steps, self.config.shift, self.config.t_min
        )  # [T+1] float64, sigmas[i] = t_i
        # sigma_t = a sqrt(t / (1 - t)) is infinite at t_0 = 1: there 1 - t is clamped at 1 - t_1 (the
        # value of the next grid point, as Flow-GRPO does), which only changes the very first step.
        one_minus = (1 - self.sigmas[:-1]).clamp(min=float(1 - self.sigmas[1]))
        self.noise_std = self.config.noise_level * torch.sqrt(self.sigmas[:-1] / one_minus)  # [T] sigma_t per step
        if not self.config.stochastic_final:
            self.noise_std[-1] = 0.0  # the final step is the deterministic Euler step

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"

    # -- sampling ---------------------------------------------------------------------------------

    def model_time(self, step_index: StepIndex) -> Tensor:
        """t_i * 1000, the float NOVA's head embeds: in (0, 1000], 1000 at step 0. 0-dim for an int, else [N]."""
        step_index = check_step_index(step_index, self.num_steps)
        device = step_index.device if isinstance(step_index, Tensor) else None
        return (self.sigmas[:-1].to(device) * 1000)[step_index].float()

    def is_stochastic(self, step_index: StepIndex) -> Tensor:
        """True where the step draws noise: every step but the last (s = T - 1), and none at all when
        noise_level = 0 (the ODE has no log-probability). Bool, shape of step_index."""
        step_index = check_step_index(step_index, self.num_steps)
        last = self.num_steps if self.config.stochastic_final else self.num_steps - 1
        return (torch.as_tensor(step_index) < last) & (self.config.noise_level > 0)

    init_noise = staticmethod(init_noise)  # x_1 ~ N(0, I)

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
        """One SDE step t_i -> t_{i+1}: the Euler-Maruyama step derived in the module docstring.

        model_output: [N, D] velocity v; sample: [N, D] x_{t_i}; step_index: int or LongTensor [N].
        The std sigma_t sqrt(-dt) is multiplied by `temperature` (MAR convention: noise * temperature).
        """
        # 1. Validate; cast the inputs up to float32.
        step_index = check_step_index(step_index, self.num_steps, batch=sample.shape[0])
        temperature = check_temperature(temperature)
        check_model_output(model_output, sample, 1, "velocity prediction")
        x = sample.float()  # [N, D]
        v = model_output.float()  # [N, D]

        # 2. Per-row grid values t = t_i, dt = t_{i+1} - t_i < 0 and sigma_t, broadcast as [N, 1].
        def rows(table: Tensor, index: StepIndex) -> Tensor:
            return gather_rows(table, index, x.dim(), x.device)

        t = rows(self.sigmas, step_index)
        dt = rows(self.sigmas, step_index + 1) - t
        sigma_t = rows(self.noise_std, step_index)  # 0 on the final step

        # 3. Clean estimate x0 = x - t v.
        pred_x0 = x - t * v  # [N, D]

        # 4. Mean: x + [v + sigma_t^2 / (2 t) (x + (1 - t) v)] dt  (x + (1 - t) v is the eps estimate).
        pred_eps = x + (1 - t) * v
        mean = x + (v + sigma_t**2 / (2 * t) * pred_eps) * dt  # [N, D]

        # 5. std = sigma_t sqrt(-dt) * temperature (0 on the final step).
        std = expand_std(sigma_t * torch.sqrt(-dt) * temperature, x)  # [N, 1]
        stochastic = self.is_stochastic(step_index).to(x.device)  # 0-dim or [N]

        # 6. Draw (or score the given) x_{t_{i+1}} and its log-probability (paper Eq. 12).
        return gaussian_step(
            mean,
            std,
            pred_x0,
            step_index,
            stochastic,
            sample_dtype=sample.dtype,
            generator=generator,
            prev_sample=prev_sample,
            variance_noise=variance_noise,
        )

    # -- training ---------------------------------------------------------------------------------

    def sample_train_time(
        self, n: int, generator: torch.Generator | None = None, device: torch.device | str | None = None
    ) -> Tensor:
        """Training times t in (0, 1): sigmoid(N(0, 1)) (logit-normal, SD3) or U(0, 1). [n] float32.

        The grid shift is a sampling-time choice and is not applied here."""
        if self.config.train_time_sampling == "logit_normal":
            return torch.sigmoid(torch.randn(n, generator=generator)).to(device)
        if self.config.train_time_sampling == "uniform":
            return torch.rand(n, generator=generator).to(device)
        raise ValueError(
            f"Unknown train_time_sampling: {self.config.train_time_sampling!r}; expected one of {TRAIN_TIME_SAMPLINGS}"
        )

    def train_model_time(self, train_time: Tensor) -> Tensor:
        """t * 1000, the float the head sees. [N]."""
        return train_time.float() * 1000

    def add_noise(self, x0: Tensor, noise: Tensor, train_time: Tensor) -> Tensor:
        """x_t = (1 - t) x0 + t eps. x0, noise: [N, D]; train_time: [N]."""
        t = train_time.float().to(x0.device).view(-1, *([1] * (x0.dim() - 1)))  # [N, 1]
        return ((1 - t) * x0.float() + t * noise.float()).to(x0.dtype)

    def training_loss(
        self,
        model_output: Tensor,
        x0: Tensor,
        noise: Tensor,
        x_t: Tensor,
        train_time: Tensor,
        mse_weight: Tensor | float = 1.0,
    ) -> Tensor:
        """Conditional flow-matching loss ||v_hat - (eps - x0)||^2, mean over D (Lipman et al. 2023),
        times `mse_weight` (per row [N] or a scalar). [N]."""
        check_model_output(model_output, x0, 1, "velocity prediction")
        target = noise.float() - x0.float()
        return mse_weight * ((model_output.float() - target) ** 2).mean(-1)
