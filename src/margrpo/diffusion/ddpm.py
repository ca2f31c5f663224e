"""DDPM ancestral sampler with exact per-step log-probabilities (MAR / Harmon diffusion head).

Conventions follow improved-DDPM (Nichol & Dhariwal 2021) as used by MAR's `DiffLoss`:
cosine or linear beta schedule over `num_train_steps`, respaced to `num_steps` evenly spaced
original timesteps, posterior mean from the predicted x0 without clipping, and the variance either
fixed (beta_tilde or beta) or learned in the log-domain range [log beta_tilde, log beta].
The head is trained on the full `num_train_steps` process and always sees original timesteps.

Notation: process index j = 0..J-1 (0 = cleanest) of a process with cumulative products
abar_j; sampling step s = 0..T-1 runs the respaced process from j = T-1 down to j = 0.
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

NOISE_SCHEDULES = ("cosine", "linear")
VARIANCES = ("learned_range", "fixed_small", "fixed_large")
PREDICTIONS = ("eps", "v")


@dataclass(frozen=True)
class DDPMConfig:
    """Configuration of a `DDPMSampler`."""

    num_train_steps: int = 1000  # length J of the training process (MAR: 1000)
    noise_schedule: str = "cosine"  # "cosine" (Nichol & Dhariwal Eq. 17, MAR) or "linear" (Ho et al.)
    num_steps: int = 100  # T sampling steps, evenly respaced over the training process (MAR: 100, Harmon: 25)
    variance: str = "learned_range"  # "learned_range" (MAR: head outputs [eps, v]), "fixed_small", "fixed_large"
    prediction: str = "eps"  # what the head predicts: "eps" (MAR) or "v" (v = sqrt(abar) eps - sqrt(1-abar) x0)
    # The last step draws noise too, with the clipped variance of j = 0 (improved-DDPM's table), so every
    # step has a log-prob. Deterministic, that step returns x0_hat itself (c0 = 1, ct = 0 at j = 0), so
    # the token's dependence on the parameters through it is missing from the policy gradient.
    stochastic_final: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_train_steps, int) or self.num_train_steps < 2:
            raise ValueError(f"num_train_steps must be an int >= 2, got {self.num_train_steps!r}")
        if not isinstance(self.num_steps, int) or not 1 <= self.num_steps <= self.num_train_steps:
            raise ValueError(
                f"num_steps must be an int in [1, num_train_steps={self.num_train_steps}] (it respaces the "
                f"training process), got {self.num_steps!r}; lower num_steps or raise num_train_steps"
            )
        if self.noise_schedule not in NOISE_SCHEDULES:
            raise ValueError(f"Unknown noise_schedule: {self.noise_schedule!r}; expected one of {NOISE_SCHEDULES}")
        if self.variance not in VARIANCES:
            raise ValueError(f"Unknown variance: {self.variance!r}; expected one of {VARIANCES}")
        if self.prediction not in PREDICTIONS:
            raise ValueError(f"Unknown prediction: {self.prediction!r}; expected one of {PREDICTIONS}")


# ----------------------------------------------------------------------------------------------
# schedules (float64, like improved-DDPM's numpy code)


def cosine_alphas_cumprod(num_train_steps: int, s: float = 0.008, max_beta: float = 0.999) -> Tensor:
    """abar_j of the cosine schedule (Nichol & Dhariwal Eq. 17), betas clipped at `max_beta`. [J] float64."""
    grid = torch.arange(num_train_steps + 1, dtype=torch.float64) / num_train_steps  # [J+1]
    f = torch.cos((grid + s) / (1 + s) * math.pi / 2) ** 2  # alpha_bar(t) up to normalisation
    betas = (1 - f[1:] / f[:-1]).clamp(max=max_beta)  # [J]
    return torch.cumprod(1 - betas, dim=0)


def linear_alphas_cumprod(num_train_steps: int) -> Tensor:
    """abar_j of the linear schedule of Ho et al., scaled to `num_train_steps` as improved-DDPM does. [J]."""
    scale = 1000 / num_train_steps
    betas = torch.linspace(scale * 1e-4, scale * 2e-2, num_train_steps, dtype=torch.float64)
    return torch.cumprod(1 - betas, dim=0)


_SCHEDULES = {"cosine": cosine_alphas_cumprod, "linear": linear_alphas_cumprod}


def respaced_timesteps(num_train_steps: int, num_steps: int) -> Tensor:
    """The T original timesteps kept by respacing: evenly spaced from 0 to J-1, rounded. [T] long, ascending."""
    if num_steps == 1:
        return torch.zeros(1, dtype=torch.long)
    stride = (num_train_steps - 1) / (num_steps - 1)
    return torch.tensor([round(i * stride) for i in range(num_steps)], dtype=torch.long)


@dataclass(frozen=True)
class _Process:
    """Closed-form quantities of a discrete Gaussian diffusion given its abar_j (all [J] float64).

    q(x_j | x0) = N(sqrt(abar_j) x0, (1 - abar_j) I); beta_j = 1 - abar_j / abar_{j-1};
    posterior q(x_{j-1} | x_j, x0) = N(c0_j x0 + ct_j x_j, beta_tilde_j I) (Ho et al. Eq. 6-7).
    """

    alphas_cumprod: Tensor
    alphas_cumprod_prev: Tensor  # abar_{j-1}, with abar_{-1} = 1
    # square roots taken in float64: 1 - abar loses most float32 digits near j = 0
    sqrt_alphas_cumprod: Tensor  # sqrt(abar)
    sqrt_one_minus_alphas_cumprod: Tensor  # sqrt(1 - abar)
    sqrt_recip_alphas_cumprod: Tensor  # 1 / sqrt(abar)
    sqrt_recipm1_alphas_cumprod: Tensor  # sqrt(1 / abar - 1)
    betas: Tensor
    posterior_variance: Tensor  # beta_tilde_j = beta_j (1 - abar_{j-1}) / (1 - abar_j); 0 at j = 0
    posterior_log_variance_clipped: Tensor  # log beta_tilde with the j = 0 entry replaced by j = 1's
    log_betas_large: (
        Tensor  # fixed_large: log beta_j, with the j = 0 entry replaced by log beta_tilde_1 (improved-DDPM)
    )
    log_betas: Tensor  # learned_range's upper end: log beta_j at every j, j = 0 included (improved-DDPM / MAR)
    posterior_coef_x0: Tensor  # c0_j = sqrt(abar_{j-1}) beta_j / (1 - abar_j)
    posterior_coef_xt: Tensor  # ct_j = sqrt(1 - beta_j) (1 - abar_{j-1}) / (1 - abar_j)

    @classmethod
    def from_alphas_cumprod(cls, abar: Tensor) -> _Process:
        abar_prev = torch.cat([abar.new_ones(1), abar[:-1]])
        betas = 1 - abar / abar_prev
        post_var = betas * (1 - abar_prev) / (1 - abar)
        # log(0) at j = 0 is clipped to the j = 1 value; a 1-step process has no stochastic step.
        clip_from = post_var[1:2] if len(abar) > 1 else betas[:1]
        post_log_var = torch.log(torch.cat([clip_from, post_var[1:]]))
        log_betas_large = torch.log(torch.cat([clip_from, betas[1:]]))
        return cls(
            alphas_cumprod=abar,
            alphas_cumprod_prev=abar_prev,
            sqrt_alphas_cumprod=abar.sqrt(),
            sqrt_one_minus_alphas_cumprod=(1 - abar).sqrt(),
            sqrt_recip_alphas_cumprod=abar.rsqrt(),
            sqrt_recipm1_alphas_cumprod=(1 / abar - 1).sqrt(),
            betas=betas,
            posterior_variance=post_var,
            posterior_log_variance_clipped=post_log_var,
            log_betas_large=log_betas_large,
            log_betas=torch.log(betas),
            posterior_coef_x0=torch.sqrt(abar_prev) * betas / (1 - abar),
            posterior_coef_xt=torch.sqrt(1 - betas) * (1 - abar_prev) / (1 - abar),
        )


# ----------------------------------------------------------------------------------------------


class DDPMSampler:
    """Ancestral DDPM sampler over the respaced process, shaped like a diffusers scheduler.

    `DDPMSampler(config)` or `DDPMSampler(num_steps=25, variance="fixed_small")` (keyword overrides
    of the default config). Schedule tables are float64 on CPU; every step computes in float32 on
    the device of its inputs.
    """

    def __init__(self, config: DDPMConfig | None = None, **overrides) -> None:
        self.config = dataclasses.replace(config or DDPMConfig(), **overrides)
        cfg = self.config
        self.num_steps = cfg.num_steps
        self.out_channels_factor = 2 if cfg.variance == "learned_range" else 1

        abar = _SCHEDULES[cfg.noise_schedule](cfg.num_train_steps)  # [J]
        self.train_process = _Process.from_alphas_cumprod(abar)  # what the head is trained on
        kept = respaced_timesteps(cfg.num_train_steps, cfg.num_steps)  # [T] ascending original timesteps
        # improved-DDPM respacing: the respaced process keeps abar at the chosen timesteps and
        # recomputes its betas from consecutive kept abar values.
        self.process = _Process.from_alphas_cumprod(abar[kept])  # [T], j = 0 cleanest
        self.timesteps = kept.flip(0)  # [T] original timestep of each sampling step (step 0 = noisiest)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"

    # -- sampling ---------------------------------------------------------------------------------

    def _process_index(self, step_index: StepIndex) -> StepIndex:
        """Sampling step s -> respaced process index j = T - 1 - s."""
        return self.num_steps - 1 - step_index

    def model_time(self, step_index: StepIndex) -> Tensor:
        """The original (un-respaced) timestep as float, as MAR's head sees it: 0-dim for an int, else [N]."""
        step_index = check_step_index(step_index, self.num_steps)
        device = step_index.device if isinstance(step_index, Tensor) else None
        return self.timesteps.to(device)[step_index].float()

    def is_stochastic(self, step_index: StepIndex) -> Tensor:
        """True where the step draws noise: every step but the last (s = T - 1), unless `stochastic_final`.
        Bool, shape of step_index."""
        step_index = check_step_index(step_index, self.num_steps)
        return torch.as_tensor(step_index) < (self.num_steps if self.config.stochastic_final else self.num_steps - 1)

    init_noise = staticmethod(init_noise)  # x_T ~ N(0, I)

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
        """One reverse step x_t -> x_{t-1} ~ N(mu, sigma^2 I) of the respaced process.

        model_output: [N, D] (eps or v) or [N, 2D] ([pred, var_values] for learned_range);
        sample: [N, D] x_t; step_index: int or LongTensor [N] (0 = noisiest).
        mu = c0 x0_hat + ct x_t (Ho et al. Eq. 7), sigma^2 from the variance mode (Nichol & Dhariwal
        Eq. 15 for learned_range), sigma scaled by `temperature` (MAR: noise * temperature).
        """
        # 1. Validate; cast the inputs up to float32.
        step_index = check_step_index(step_index, self.num_steps, batch=sample.shape[0])
        temperature = check_temperature(temperature)
        check_model_output(model_output, sample, self.out_channels_factor, f"variance={self.config.variance!r}")
        x_t = sample.float()  # [N, D]
        out = model_output.float()
        dim = sample.shape[-1]
        pred, var_values = out[..., :dim], out[..., dim:]  # [N, D], [N, D] or [N, 0]

        # 2. Per-row schedule quantities of the respaced process, broadcast as [N, 1].
        j = self._process_index(step_index)
        p = self.process

        def rows(table: Tensor) -> Tensor:
            return gather_rows(table, j, x_t.dim(), x_t.device)

        # 3. Clean estimate x0_hat from the prediction (no clipping: MAR uses clip_denoised=False).
        pred_x0 = self._pred_x0(pred, x_t, p, j)  # [N, D]

        # 4. Posterior mean mu = c0 x0_hat + ct x_t (Ho et al. Eq. 7).
        mean = rows(p.posterior_coef_x0) * pred_x0 + rows(p.posterior_coef_xt) * x_t  # [N, D]

        # 5. Log-variance of the step, std = exp(log_var / 2) * temperature; 0 on a deterministic final step.
        std, stochastic = self._step_std(var_values, step_index, j, x_t, temperature)

        # 6. Draw (or score the given) x_{t-1} and its log-probability (paper Eq. 12).
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

    def _step_std(
        self, var_values: Tensor, step_index: StepIndex, j: StepIndex, x_t: Tensor, temperature: float
    ) -> tuple[Tensor, Tensor]:
        """(std, stochastic) of step `step_index` (process index `j`): std = exp(log_var / 2) * temperature, 0 where
        the step is deterministic (a noiseless final step); [N, 1], or [N, D] for learned_range. stochastic: 0-dim or
        [N] bool."""
        p = self.process

        def rows(table: Tensor) -> Tensor:
            return gather_rows(table, j, x_t.dim(), x_t.device)

        log_var = self._log_variance(
            var_values, rows(p.posterior_log_variance_clipped), rows(p.log_betas_large), rows(p.log_betas)
        )
        stochastic = self.is_stochastic(step_index).to(x_t.device)  # 0-dim or [N]
        row_stochastic = stochastic.view(-1, *([1] * (x_t.dim() - 1)))
        std = torch.where(row_stochastic, torch.exp(0.5 * log_var) * temperature, 0.0)
        return expand_std(std, x_t), stochastic

    def _pred_x0(self, pred: Tensor, x_t: Tensor, process: _Process, index: StepIndex) -> Tensor:
        """x0_hat = (x_t - sqrt(1-abar) eps) / sqrt(abar) (Ho et al. Eq. 15), or sqrt(abar) x_t - sqrt(1-abar) v.

        index: process index j (int or LongTensor [N]); pred, x_t: [N, D] float32."""

        def rows(table: Tensor) -> Tensor:
            return gather_rows(table, index, x_t.dim(), x_t.device)

        if self.config.prediction == "eps":
            return rows(process.sqrt_recip_alphas_cumprod) * x_t - rows(process.sqrt_recipm1_alphas_cumprod) * pred
        return rows(process.sqrt_alphas_cumprod) * x_t - rows(process.sqrt_one_minus_alphas_cumprod) * pred

    def _log_variance(self, var_values: Tensor, log_small: Tensor, log_large: Tensor, log_betas: Tensor) -> Tensor:
        """log sigma^2: fixed_small = log beta_tilde (clipped), fixed_large = log beta (j = 0: beta_tilde_1),
        learned_range = frac log beta + (1 - frac) log beta_tilde with frac = (v + 1) / 2 (Nichol & Dhariwal
        Eq. 15; the unclipped log beta, as improved-DDPM's and MAR's p_mean_variance),
        clamped to [0, 1]: outside it the "interpolation" extrapolates to variances no step has (an
        under-trained toy head drifted to frac ~ 14, i.e. pure-noise samples)."""
        variance = self.config.variance
        if variance == "fixed_small":
            return log_small
        if variance == "fixed_large":
            return log_large
        if variance == "learned_range":
            frac = ((var_values + 1) / 2).clamp(0, 1)  # [N, D]
            return frac * log_betas + (1 - frac) * log_small
        raise ValueError(f"Unknown variance: {variance!r}; expected one of {VARIANCES}")

    # -- training ---------------------------------------------------------------------------------

    def sample_train_time(
        self, n: int, generator: torch.Generator | None = None, device: torch.device | str | None = None
    ) -> Tensor:
        """Training timesteps j ~ U{0, ..., J-1} of the full process. [n] long."""
        return torch.randint(0, self.config.num_train_steps, (n,), generator=generator).to(device)

    def train_model_time(self, train_time: Tensor) -> Tensor:
        """The float the head sees for a training timestep: the timestep itself. [N]."""
        return train_time.float()

    def add_noise(self, x0: Tensor, noise: Tensor, train_time: Tensor) -> Tensor:
        """x_j = sqrt(abar_j) x0 + sqrt(1 - abar_j) eps (Ho et al. Eq. 4). x0, noise: [N, D]; train_time: [N] long."""
        p = self.train_process
        sqrt_abar = gather_rows(p.sqrt_alphas_cumprod, train_time, x0.dim(), x0.device)  # [N, 1]
        sqrt_one_minus = gather_rows(p.sqrt_one_minus_alphas_cumprod, train_time, x0.dim(), x0.device)  # [N, 1]
        return (sqrt_abar * x0.float() + sqrt_one_minus * noise.float()).to(x0.dtype)

    def training_loss(
        self,
        model_output: Tensor,
        x0: Tensor,
        noise: Tensor,
        x_t: Tensor,
        train_time: Tensor,
        mse_weight: Tensor | float = 1.0,
    ) -> Tensor:
        """Per-row loss [N]: MSE of the prediction (mean over D) times `mse_weight`, plus for
        learned_range the VLB term of improved-DDPM's hybrid loss L_simple + L_vlb (Nichol & Dhariwal
        Eq. 16). The weight re-balances the mean's loss only (e.g. to an x0 loss): scaling the VLB
        with it would silence the variance exactly at the small-noise steps where it matters.

        L_vlb at j > 0 is KL(q(x_{j-1} | x_j, x0) || p(x_{j-1} | x_j)) in bits per channel, with the model
        mean built from the stop-gradiented prediction so that only the variance learns from it; at
        j = 0 it is the discretised-Gaussian decoder NLL (256 bins on [-1, 1], as MAR/improved-DDPM use,
        here with the exact normal CDF). It is scaled by num_train_steps / 1000 like improved-DDPM.
        """
        check_model_output(model_output, x0, self.out_channels_factor, f"variance={self.config.variance!r}")
        out = model_output.float()
        x0, noise, x_t = x0.float(), noise.float(), x_t.float()
        dim = x0.shape[-1]
        pred = out[..., :dim]  # [N, D]
        p = self.train_process

        def rows(table: Tensor) -> Tensor:
            return gather_rows(table, train_time, x0.dim(), x0.device)

        if self.config.prediction == "eps":
            target = noise
        else:  # v = sqrt(abar) eps - sqrt(1 - abar) x0 (Salimans & Ho 2022)
            target = rows(p.sqrt_alphas_cumprod) * noise - rows(p.sqrt_one_minus_alphas_cumprod) * x0
        loss = mse_weight * ((pred - target) ** 2).mean(-1)  # [N]
        if self.config.variance != "learned_range":
            return loss

        # Hybrid loss: VLB term with the predicted mean frozen.
        model_x0 = self._pred_x0(pred.detach(), x_t, p, train_time)
        model_mean = rows(p.posterior_coef_x0) * model_x0 + rows(p.posterior_coef_xt) * x_t
        log_small = rows(p.posterior_log_variance_clipped)
        model_log_var = self._log_variance(out[..., dim:], log_small, rows(p.log_betas_large), rows(p.log_betas))
        true_mean = rows(p.posterior_coef_x0) * x0 + rows(p.posterior_coef_xt) * x_t
        kl = normal_kl(true_mean, log_small, model_mean, model_log_var).mean(-1) / math.log(2.0)  # [N] bits
        vb, first = kl, train_time.to(x0.device) == 0
        if bool(first.any()):  # the decoder NLL only where j = 0 (~1 row in 1000: the normal CDFs are costly)
            vb = kl.clone()
            vb[first] = -discretized_gaussian_log_likelihood(
                x0[first], model_mean[first], 0.5 * model_log_var[first]
            ).mean(-1) / math.log(2.0)
        return loss + vb * (self.config.num_train_steps / 1000.0)


def normal_kl(mean1: Tensor, log_var1: Tensor, mean2: Tensor, log_var2: Tensor) -> Tensor:
    """Elementwise KL(N(mean1, exp(log_var1)) || N(mean2, exp(log_var2))) in nats."""
    return 0.5 * (
        log_var2 - log_var1 + torch.exp(log_var1 - log_var2) + (mean1 - mean2) ** 2 * torch.exp(-log_var2) - 1
    )


def discretized_gaussian_log_likelihood(
    x: Tensor, mean: Tensor, log_scale: Tensor, bin_width: float = 2 / 255
) -> Tensor:
    """Elementwise log P(bin of x) under N(mean, exp(log_scale)^2) for data quantised to 256 bins on
    [-1, 1] (Ho et al. Sec. 3.3); the edge bins extend to -inf / +inf."""
    inv_scale = torch.exp(-log_scale)
    upper = (x - mean + bin_width / 2) * inv_scale
    lower = (x - mean - bin_width / 2) * inv_scale
    log_cdf_upper = torch.special.log_ndtr(upper)  # log P(X <= upper edge)
    log_sf_lower = torch.special.log_ndtr(-lower)  # log P(X > lower edge)
    log_bin = torch.log((torch.special.ndtr(upper) - torch.special.ndtr(lower)).clamp(min=1e-12))
    return torch.where(x < -0.999, log_cdf_upper, torch.where(x > 0.999, log_sf_lower, log_bin))
