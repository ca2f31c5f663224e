"""The samplers' contract (design.md §3.1): exact per-step log-probabilities that recompute bit for bit,
per-row step indices, temperature, the deterministic final step, the limits each process must
reduce to, and training losses. Small shapes only: everything here runs in a few seconds on CPU."""

from __future__ import annotations

import math

import pytest
import torch

from margrpo.diffusion import (
    DDPMConfig,
    DDPMSampler,
    FlowConfig,
    FlowSDESampler,
    Sampler,
    build_sampler,
)

T = 6  # sampling steps in most tests
N, D = 7, 4  # rows (tokens), channels

# Every DDPM variance mode, v-prediction, and the flow SDE with and without a grid shift.
CASES = {
    "ddpm-learned_range": lambda: DDPMSampler(num_steps=T, variance="learned_range"),
    "ddpm-fixed_small": lambda: DDPMSampler(num_steps=T, variance="fixed_small"),
    "ddpm-fixed_large": lambda: DDPMSampler(num_steps=T, variance="fixed_large"),
    "ddpm-v-linear": lambda: DDPMSampler(
        num_steps=T, variance="learned_range", prediction="v", noise_schedule="linear"
    ),
    "flow": lambda: FlowSDESampler(num_steps=T, noise_level=0.7),
    "flow-shift3": lambda: FlowSDESampler(num_steps=T, noise_level=1.0, shift=3.0),
}


@pytest.fixture(params=list(CASES))
def sampler(request) -> Sampler:
    return CASES[request.param]()


def head_output(sampler: Sampler, n: int = N, d: int = D, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    """A random stand-in for the head: [n, d] prediction, plus [n, d] variance values in (-1, 1) if needed."""
    g = torch.Generator().manual_seed(seed)
    pred = torch.randn(n, d, generator=g)
    if sampler.out_channels_factor == 2:
        pred = torch.cat([pred, torch.tanh(torch.randn(n, d, generator=g))], dim=-1)
    return pred.to(dtype)


def noisy_sample(n: int = N, d: int = D, seed: int = 1, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed)).to(dtype)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_samplers_follow_the_protocol(sampler):
    assert isinstance(sampler, Sampler)
    assert sampler.num_steps == T
    assert sampler.is_stochastic(torch.arange(T)).tolist() == [True] * (T - 1) + [False]


# ----------------------------------------------------------------------------------------------
# log-probabilities


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_log_prob_is_the_gaussian_density_of_the_drawn_sample(sampler, temperature):
    x = noisy_sample()
    for k in (0, T // 2, T - 2):
        out = sampler.step(head_output(sampler, seed=k), k, x, generator=gen(k), temperature=temperature)
        assert out.log_prob.shape == (N,) and out.log_prob.dtype == torch.float32
        assert out.mean.shape == (N, D) and out.pred_x0.shape == (N, D)
        assert out.std.shape in {(N, 1), (N, D)} and bool((out.std > 0).all())
        expected = torch.distributions.Normal(out.mean, out.std.expand(N, D)).log_prob(out.prev_sample.float()).sum(-1)
        torch.testing.assert_close(out.log_prob, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_recomputing_with_the_drawn_sample_reproduces_the_log_prob(sampler, dtype):
    # Per-row steps mixing every step, the final (deterministic) one included.
    steps = torch.tensor([0, 1, 2, 3, 4, 5, 2])
    assert steps.max() == T - 1
    x, model_out = noisy_sample(dtype=dtype), head_output(sampler, dtype=dtype)
    drawn = sampler.step(model_out, steps, x, generator=gen(3), temperature=0.9)
    again = sampler.step(model_out, steps, x, temperature=0.9, prev_sample=drawn.prev_sample)

    assert drawn.prev_sample.dtype == dtype and drawn.log_prob.dtype == torch.float32
    ratio = torch.exp(again.log_prob - drawn.log_prob)
    torch.testing.assert_close(ratio, torch.ones(N), rtol=0, atol=1e-6)
    assert torch.equal(again.log_prob, drawn.log_prob)

    final = ~sampler.is_stochastic(steps)
    assert final.tolist() == [False] * 5 + [True, False]
    assert bool((drawn.log_prob[final] == 0).all()) and bool((drawn.std[final] == 0).all())
    torch.testing.assert_close(drawn.prev_sample[final].float(), drawn.mean[final].to(dtype).float())
    if dtype == torch.bfloat16:  # the density of the bf16 sample actually returned, evaluated in float32
        rows = ~final
        expected = torch.distributions.Normal(drawn.mean[rows], drawn.std[rows].expand(-1, D))
        torch.testing.assert_close(
            drawn.log_prob[rows], expected.log_prob(drawn.prev_sample[rows].float()).sum(-1), rtol=1e-5, atol=1e-4
        )


def test_per_row_steps_equal_one_call_per_step(sampler):
    steps = torch.tensor([4, 0, 2, 5, 1, 3, 0])
    x, model_out = noisy_sample(), head_output(sampler)
    batched = sampler.step(model_out, steps, x, generator=gen(0))
    for i, k in enumerate(steps.tolist()):
        single = sampler.step(model_out[i : i + 1], k, x[i : i + 1], prev_sample=batched.prev_sample[i : i + 1])
        torch.testing.assert_close(single.mean, batched.mean[i : i + 1])
        torch.testing.assert_close(single.std.expand(1, D), batched.std[i : i + 1].expand(1, D))
        torch.testing.assert_close(single.pred_x0, batched.pred_x0[i : i + 1])
        if k < T - 1:
            torch.testing.assert_close(single.log_prob, batched.log_prob[i : i + 1])
        else:
            assert single.log_prob is None
    torch.testing.assert_close(sampler.model_time(steps), torch.stack([sampler.model_time(k) for k in steps.tolist()]))


def test_temperature_scales_the_std(sampler):
    x, model_out = noisy_sample(), head_output(sampler)
    base = sampler.step(model_out, 1, x, generator=gen(0))
    cold = sampler.step(model_out, 1, x, generator=gen(0), temperature=0.25)
    torch.testing.assert_close(cold.std, 0.25 * base.std)
    torch.testing.assert_close(cold.mean, base.mean)
    # same noise, a quarter of the spread
    spread, base_spread = cold.prev_sample - cold.mean, base.prev_sample - base.mean
    torch.testing.assert_close(spread, 0.25 * base_spread, rtol=1e-5, atol=1e-6)


def test_final_step_is_deterministic(sampler):
    x, model_out = noisy_sample(dtype=torch.bfloat16), head_output(sampler, dtype=torch.bfloat16)
    g = gen(0)
    out = sampler.step(model_out, T - 1, x, generator=g)
    assert out.log_prob is None
    assert bool((out.std == 0).all())
    assert torch.equal(out.prev_sample, out.mean.to(torch.bfloat16))
    assert torch.equal(g.get_state(), gen(0).get_state())  # no noise drawn
    given = sampler.step(model_out, T - 1, x, prev_sample=out.prev_sample)
    assert given.log_prob is None and torch.equal(given.prev_sample, out.prev_sample)


# ----------------------------------------------------------------------------------------------
# the limits each process must reduce to


def test_flow_with_zero_noise_is_the_euler_ode_step():
    sampler = FlowSDESampler(num_steps=T, noise_level=0.0, shift=2.0)
    x, v = noisy_sample(), head_output(sampler)
    for k in range(T):
        out = sampler.step(v, k, x, generator=gen(k))
        dt = float(sampler.sigmas[k + 1] - sampler.sigmas[k])
        torch.testing.assert_close(out.mean, x + v * dt)
        torch.testing.assert_close(out.prev_sample, x + v * dt)
        torch.testing.assert_close(out.pred_x0, x - float(sampler.sigmas[k]) * v)
        assert out.log_prob is None  # the ODE carries no log-probability


def test_flow_sde_step_matches_the_formula_written_out():
    sampler = FlowSDESampler(num_steps=4, noise_level=0.8)
    x, v = noisy_sample(), head_output(sampler)
    k = 2
    t, t_next = 0.5, 0.25  # the linear grid 1, 0.75, 0.5, 0.25, 0
    sigma = 0.8 * math.sqrt(t / (1 - t))
    out = sampler.step(v, k, x, generator=gen(0))
    expected_mean = x + (v + sigma**2 / (2 * t) * (x + (1 - t) * v)) * (t_next - t)
    torch.testing.assert_close(out.mean, expected_mean)
    torch.testing.assert_close(out.std, torch.full((N, 1), sigma * math.sqrt(t - t_next)))
    # the first step (t = 1) clamps 1 - t at 1 - t_1
    first = sampler.step(v, 0, x, generator=gen(0))
    torch.testing.assert_close(first.std, torch.full((N, 1), 0.8 * math.sqrt(1 / 0.25) * math.sqrt(0.25)))


def independent_cosine_alphas_cumprod(num_train_steps: int) -> list[float]:
    """Nichol & Dhariwal Eq. 17 with betas clipped at 0.999, written out in plain Python floats."""

    def f(t: float) -> float:
        return math.cos((t / num_train_steps + 0.008) / 1.008 * math.pi / 2) ** 2

    out, prod = [], 1.0
    for j in range(num_train_steps):
        prod *= 1 - min(1 - f(j + 1) / f(j), 0.999)
        out.append(prod)
    return out


@pytest.mark.parametrize("num_steps", [1000, 10])
def test_ddpm_fixed_small_is_the_posterior_of_the_respaced_process(num_steps):
    sampler = DDPMSampler(num_steps=num_steps, variance="fixed_small")
    abar_all = independent_cosine_alphas_cumprod(1000)
    kept = [round(i * 999 / (num_steps - 1)) for i in range(num_steps)]  # evenly spaced, 0 and 999 included
    assert sampler.timesteps.tolist() == kept[::-1]
    x, eps = noisy_sample(), head_output(sampler)
    for k in (0, 1, num_steps // 2, num_steps - 2):
        j = num_steps - 1 - k  # respaced index, 0 = cleanest
        abar, abar_prev = abar_all[kept[j]], abar_all[kept[j - 1]]
        beta = 1 - abar / abar_prev
        x0 = (x.double() - math.sqrt(1 - abar) * eps.double()) / math.sqrt(abar)
        coef_x0 = math.sqrt(abar_prev) * beta / (1 - abar)
        coef_xt = math.sqrt(1 - beta) * (1 - abar_prev) / (1 - abar)
        mean = coef_x0 * x0 + coef_xt * x.double()
        var = beta * (1 - abar_prev) / (1 - abar)
        out = sampler.step(eps, k, x, generator=gen(k))
        assert float(sampler.model_time(k)) == kept[j]
        torch.testing.assert_close(out.pred_x0.double(), x0, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out.mean.double(), mean, rtol=1e-4, atol=1e-5)
        std = torch.full((N, 1), math.sqrt(var), dtype=torch.float64)
        torch.testing.assert_close(out.std.double(), std, rtol=1e-5, atol=0)


@pytest.mark.parametrize("variance", ["fixed_small", "fixed_large", "learned_range"])
def test_ddpm_matches_diffusers_ddpm_scheduler(variance):
    from diffusers import DDPMScheduler

    reference = DDPMScheduler(
        num_train_timesteps=1000,
        beta_schedule="squaredcos_cap_v2",
        variance_type=variance,
        clip_sample=False,
        prediction_type="epsilon",
    )
    reference.set_timesteps(1000)
    sampler = DDPMSampler(num_steps=1000, variance=variance)
    x, model_out = noisy_sample(), head_output(sampler)
    for k in (0, 300, 998, 999):
        t = int(reference.timesteps[k])
        assert float(sampler.model_time(k)) == t
        ours = sampler.step(model_out, k, x, generator=gen(k))
        theirs = reference.step(model_out, t, x, generator=gen(k)).prev_sample  # same float32 noise draws
        torch.testing.assert_close(ours.prev_sample, theirs, rtol=1e-4, atol=1e-4)


def exact_gaussian_head(sampler: Sampler, k: int, x: torch.Tensor, mu: float, s: float) -> torch.Tensor:
    """The optimal head for data x0 ~ N(mu, s^2) (s = 0: the constant mu): E[x0 | x_t] turned into eps / v."""
    if isinstance(sampler, FlowSDESampler):
        t = float(sampler.sigmas[k])
        a, b = 1 - t, t
    else:
        abar = float(sampler.process.alphas_cumprod[sampler.num_steps - 1 - k])
        a, b = math.sqrt(abar), math.sqrt(1 - abar)
    x0 = mu + a * s**2 / (a**2 * s**2 + b**2) * (x - a * mu)
    if isinstance(sampler, FlowSDESampler):
        return (x - x0) / b  # v = eps - x0 with eps = (x - (1 - t) x0) / t
    eps = (x - a * x0) / b
    pred = eps if sampler.config.prediction == "eps" else a * eps - b * x0
    if sampler.out_channels_factor == 2:
        pred = torch.cat([pred, torch.zeros_like(pred)], dim=-1)  # variance halfway in the learned range
    return pred


def sample_toy(sampler: Sampler, n: int, mu: float, s: float, seed: int = 0) -> torch.Tensor:
    g = gen(seed)
    x = sampler.init_noise((n, 1), generator=g)
    for k in range(sampler.num_steps):
        x = sampler.step(exact_gaussian_head(sampler, k, x, mu, s), k, x, generator=g).prev_sample
    return x


def test_sampling_a_known_constant_converges_to_it(sampler):
    x = sample_toy(sampler, n=64, mu=0.37, s=0.0)
    torch.testing.assert_close(x, torch.full((64, 1), 0.37), rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "make",
    [
        lambda: DDPMSampler(num_steps=100, variance="learned_range"),
        lambda: DDPMSampler(num_steps=100, variance="fixed_small", prediction="v"),
        lambda: FlowSDESampler(num_steps=50, noise_level=0.7),
        lambda: FlowSDESampler(num_steps=50, noise_level=1.0, shift=3.0),
    ],
    ids=["ddpm-learned_range", "ddpm-v", "flow", "flow-shift3"],
)
def test_sampling_gaussian_data_reproduces_its_marginal(make):
    # With the exact denoiser for x0 ~ N(mu, s^2), a sampler whose steps have the right marginals
    # ends at N(mu, s^2) up to discretisation error; a wrong drift or variance does not.
    x = sample_toy(make(), n=20000, mu=0.7, s=0.5)
    assert abs(x.mean().item() - 0.7) < 0.02
    assert abs(x.std().item() / 0.5 - 1) < 0.04


# ----------------------------------------------------------------------------------------------
# training


def training_batch(sampler: Sampler, n: int = 64):
    g = gen(5)
    x0 = torch.randn(n, D, generator=g).clamp(-0.9, 0.9)
    noise = torch.randn(n, D, generator=g)
    t = sampler.sample_train_time(n, generator=g)
    return x0, noise, t, sampler.add_noise(x0, noise, t)


def exact_target(sampler: Sampler, x0, noise, t, variance_value: float = -1.0) -> torch.Tensor:
    if isinstance(sampler, FlowSDESampler):
        return noise - x0
    abar = sampler.train_process.alphas_cumprod[t].float()[:, None]
    target = noise if sampler.config.prediction == "eps" else abar.sqrt() * noise - (1 - abar).sqrt() * x0
    if sampler.out_channels_factor == 2:  # v = -1 selects beta_tilde, the true posterior variance
        target = torch.cat([target, torch.full_like(target, variance_value)], dim=-1)
    return target


def test_training_loss_vanishes_at_the_exact_target(sampler):
    x0, noise, t, x_t = training_batch(sampler)
    if isinstance(sampler, DDPMSampler):
        t = t.clamp(min=1)  # j = 0 has a decoder NLL, never 0; checked below
        x_t = sampler.add_noise(x0, noise, t)
    loss = sampler.training_loss(exact_target(sampler, x0, noise, t), x0, noise, x_t, t)
    assert loss.shape == (64,)
    assert float(loss.abs().max()) < 1e-5

    random_out = head_output(sampler, n=64, seed=9).requires_grad_()
    loss = sampler.training_loss(random_out, x0, noise, x_t, t)
    assert bool(torch.isfinite(loss).all()) and float(loss.detach().mean()) > 0.1
    loss.mean().backward()
    assert bool(torch.isfinite(random_out.grad).all())


def test_training_times_and_noising(sampler):
    x0, noise, t, x_t = training_batch(sampler, n=256)
    head_t = sampler.train_model_time(t)
    assert head_t.dtype == torch.float32 and bool((head_t >= 0).all()) and bool((head_t < 1000).all())
    if isinstance(sampler, DDPMSampler):
        assert t.dtype == torch.long and int(t.max()) > 900
        abar = sampler.train_process.alphas_cumprod[t].float()[:, None]
        torch.testing.assert_close(x_t, abar.sqrt() * x0 + (1 - abar).sqrt() * noise)
    else:
        assert bool((t > 0).all()) and bool((t < 1).all())
        torch.testing.assert_close(x_t, (1 - t[:, None]) * x0 + t[:, None] * noise)


def test_ddpm_learned_range_loss_at_t0_is_finite_and_vlb_leaves_the_mean_alone():
    sampler = DDPMSampler(num_steps=T, variance="learned_range")
    x0, noise, t, _ = training_batch(sampler, n=16)
    t = torch.arange(16) % 3  # includes j = 0 (decoder NLL)
    x_t = sampler.add_noise(x0, noise, t)
    out = exact_target(sampler, x0, noise, t, variance_value=0.3).requires_grad_()
    loss = sampler.training_loss(out, x0, noise, x_t, t)
    assert bool(torch.isfinite(loss).all()) and bool((loss[t == 0] > 0).all())
    loss.sum().backward()
    # the VLB term trains the variance only: the gradient on the eps channels is the MSE's, here 0
    assert float(out.grad[:, :D].abs().max()) == 0.0
    assert float(out.grad[t > 0, D:].abs().max()) > 0.0


# ----------------------------------------------------------------------------------------------
# model time, construction, validation


def test_mse_weight_scales_the_mean_loss_only(sampler):
    """A per-row weight (x0 re-weighting) must not reach the learned-variance VLB term."""
    x0, noise, t, x_t = training_batch(sampler)
    out = head_output(sampler, n=64, seed=5)
    full = sampler.training_loss(out, x0, noise, x_t, t)
    w = torch.rand(64, generator=gen(7))
    weighted = sampler.training_loss(out, x0, noise, x_t, t, mse_weight=w)
    without_mse = sampler.training_loss(out, x0, noise, x_t, t, mse_weight=0.0)
    if getattr(sampler, "out_channels_factor", 1) == 2:
        assert bool((without_mse > 0).all())  # the VLB term survives a zero weight
    else:
        assert float(without_mse.abs().max()) == 0.0
    mse = full - without_mse
    torch.testing.assert_close(weighted, w * mse + without_mse)


def test_ddpm_learned_range_variance_stays_inside_its_range():
    """frac = (v + 1) / 2 is clamped: any head output gives a variance between beta_tilde and beta."""
    sampler = DDPMSampler(num_steps=T, variance="learned_range")
    x = noisy_sample(n=3)
    for v in (-30.0, 0.0, 27.0):
        out = torch.cat([torch.zeros(3, D), torch.full((3, D), v)], dim=-1)
        std = sampler.step(out, 2, x, generator=gen()).std
        small = DDPMSampler(num_steps=T, variance="fixed_small").step(out[:, :D], 2, x, generator=gen()).std
        large = DDPMSampler(num_steps=T, variance="fixed_large").step(out[:, :D], 2, x, generator=gen()).std
        assert bool((std >= small * (1 - 1e-6)).all()) and bool((std <= large * (1 + 1e-6)).all())


def test_ddpm_learned_range_spans_log_beta_0_at_the_last_step():
    """MAR / improved-DDPM: learned_range interpolates between log beta_tilde (clipped: beta_tilde_1 at j = 0)
    and the unclipped log beta_j; only fixed_large replaces beta_0 by beta_tilde_1."""
    sampler = DDPMSampler(DDPMConfig(num_steps=T, variance="learned_range"), stochastic_final=True)
    x = noisy_sample(n=2)
    last = T - 1  # the sampling step that lands on j = 0
    top = torch.cat([torch.zeros(2, D), torch.ones(2, D)], dim=-1)  # v = 1: frac = 1, the upper end
    bottom = torch.cat([torch.zeros(2, D), -torch.ones(2, D)], dim=-1)
    p = sampler.process
    torch.testing.assert_close(sampler.step(top, last, x, generator=gen()).std, p.betas[0].sqrt().float().expand(2, D))
    torch.testing.assert_close(
        sampler.step(bottom, last, x, generator=gen()).std, p.posterior_variance[1].sqrt().float().expand(2, D)
    )
    large = DDPMSampler(DDPMConfig(num_steps=T, variance="fixed_large"), stochastic_final=True)
    torch.testing.assert_close(
        large.step(top[:, :D], last, x, generator=gen()).std.expand(2, D),
        p.posterior_variance[1].sqrt().float().expand(2, D),
    )


def test_model_time():
    ddpm = DDPMSampler(num_steps=4)
    assert ddpm.model_time(torch.arange(4)).tolist() == [999.0, 666.0, 333.0, 0.0]
    flow = FlowSDESampler(num_steps=4)
    assert flow.model_time(torch.arange(4)).tolist() == [1000.0, 750.0, 500.0, 250.0]
    assert flow.model_time(2).dim() == 0


def test_config_objects_and_registry():
    assert DDPMSampler(DDPMConfig(num_steps=25)).config == DDPMSampler(num_steps=25).config
    assert FlowSDESampler(FlowConfig(), noise_level=0.3).config.noise_level == 0.3
    assert DDPMSampler(variance="learned_range").out_channels_factor == 2
    assert DDPMSampler(variance="fixed_large").out_channels_factor == 1
    assert isinstance(build_sampler("flow", num_steps=3), FlowSDESampler)
    assert build_sampler("ddpm", num_steps=3).num_steps == 3
    with pytest.raises(ValueError, match="Unknown sampler kind: 'euler'; expected one of"):
        build_sampler("euler")


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: DDPMConfig(noise_schedule="sigmoid"), "Unknown noise_schedule: 'sigmoid'; expected one of"),
        (lambda: DDPMConfig(variance="learned"), "Unknown variance: 'learned'; expected one of"),
        (lambda: DDPMConfig(prediction="x0"), "Unknown prediction: 'x0'; expected one of"),
        (lambda: DDPMConfig(num_steps=2000), r"num_steps must be an int in \[1, num_train_steps=1000\]"),
        (lambda: DDPMConfig(num_steps=0), "lower num_steps or raise num_train_steps"),
        (lambda: DDPMConfig(num_train_steps=1), "num_train_steps must be an int >= 2"),
        (lambda: DDPMSampler(num_steps=25.0), "num_steps must be an int"),
        (lambda: FlowConfig(num_steps=0), "num_steps must be an int >= 1"),
        (lambda: FlowConfig(noise_level=-0.1), "noise_level must be finite and >= 0"),
        (lambda: FlowConfig(shift=0.0), "shift must be finite and > 0"),
        (lambda: FlowSDESampler(train_time_sampling="beta"), "Unknown train_time_sampling: 'beta'"),
    ],
)
def test_invalid_configs_raise_helpful_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_invalid_step_inputs_raise(sampler):
    x, out = noisy_sample(), head_output(sampler)
    with pytest.raises(ValueError, match=r"step_index must lie in \[0, 6\)"):
        sampler.step(out, T, x)
    with pytest.raises(ValueError, match=r"step_index values must lie in \[0, 6\)"):
        sampler.step(out, torch.full((N,), -1), x)
    with pytest.raises(ValueError, match=r"step_index tensor must have shape \[N\] = \[7\]"):
        sampler.step(out, torch.zeros(3, dtype=torch.long), x)
    with pytest.raises(ValueError, match="model_output must have shape"):
        sampler.step(out[:, :-1], 0, x)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        sampler.step(out, 0, x, temperature=0.0)
    with pytest.raises(ValueError, match="prev_sample must have the sample's shape"):
        sampler.step(out, 0, x, prev_sample=x[:2])


def _likelihood_ratio_vs_pathwise(head: str, stochastic_final: bool, n: int = 20000) -> float:
    """cos between the policy-gradient (likelihood-ratio) estimate of grad E[R] and the pathwise gradient,
    for a small x0-predicting network driving the head's sampler (the toy heads' parameterisation)."""
    torch.manual_seed(0)
    if head == "flow":
        sampler = FlowSDESampler(num_steps=5, noise_level=0.7, stochastic_final=stochastic_final)
    else:
        sampler = DDPMSampler(num_steps=5, variance="fixed_small", stochastic_final=stochastic_final)
        abar = sampler.process.alphas_cumprod.float()
    net = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))

    def model_output(x, i):
        t = sampler.model_time(i).expand(len(x))[:, None] / 1000
        x0 = net(torch.cat([x, t], -1))
        if head == "flow":
            return (x - x0) / t  # x0 prediction -> velocity
        a = abar[sampler.num_steps - 1 - i]
        return (x - a.sqrt() * x0) / (1 - a).sqrt()  # x0 prediction -> eps

    def trajectory(seed, grad):
        g = torch.Generator().manual_seed(seed)
        xs = [sampler.init_noise((n, 4), generator=g)]
        with torch.set_grad_enabled(grad):
            for i in range(sampler.num_steps):
                xs.append(sampler.step(model_output(xs[-1], i), i, xs[-1], generator=g).prev_sample)
        return xs

    def reward(x):
        return x.sum(-1)

    pathwise = torch.autograd.grad(reward(trajectory(0, True)[-1]).mean(), list(net.parameters()))
    xs = [x.detach() for x in trajectory(1, False)]
    adv = reward(xs[-1]) - reward(xs[-1]).mean()
    surrogate = sum(
        (adv * sampler.step(model_output(xs[i], i), i, xs[i], prev_sample=xs[i + 1]).log_prob).mean()
        for i in range(sampler.num_steps)
        if bool(sampler.is_stochastic(i))
    )
    lr = torch.autograd.grad(surrogate, list(net.parameters()))

    def flat(gs):
        return torch.cat([g.flatten() for g in gs])

    return torch.nn.functional.cosine_similarity(flat(lr), flat(pathwise), dim=0).item()


@pytest.mark.parametrize("head", ["flow", "ddpm"])
def test_policy_gradient_matches_the_pathwise_gradient_only_with_a_stochastic_final_step(head):
    """With a deterministic last step the likelihood-ratio estimate misses that step's dependence on the
    parameters — for an x0 head, the whole token — and is biased (cos ~0.38 for the flow head, independent
    of n); with `stochastic_final` every step has a log-prob and the two estimates agree."""
    assert _likelihood_ratio_vs_pathwise(head, stochastic_final=True) > 0.98
    assert _likelihood_ratio_vs_pathwise(head, stochastic_final=False) < 0.6


def test_ddpm_stochastic_final_step_has_the_clipped_variance_and_a_log_prob():
    sampler = DDPMSampler(num_steps=4, variance="fixed_small", stochastic_final=True)
    assert bool(sampler.is_stochastic(3)) and not bool(
        DDPMSampler(num_steps=4, variance="fixed_small").is_stochastic(3)
    )
    x, eps = torch.randn(6, 3), torch.randn(6, 3)
    out = sampler.step(eps, 3, x, generator=torch.Generator().manual_seed(0))
    expected_std = math.exp(0.5 * float(sampler.process.posterior_log_variance_clipped[0]))
    torch.testing.assert_close(out.std.expand_as(out.mean), torch.full_like(out.mean, expected_std))
    expected = torch.distributions.Normal(out.mean, out.std.expand_as(out.mean)).log_prob(out.prev_sample).sum(-1)
    torch.testing.assert_close(out.log_prob, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out.mean, out.pred_x0)  # at j = 0 the posterior mean is x0_hat


def test_stochastic_final_step_has_the_sde_std_and_a_log_prob():
    sampler = FlowSDESampler(num_steps=4, noise_level=0.7, stochastic_final=True)
    assert bool(sampler.is_stochastic(3)) and float(sampler.noise_std[-1]) > 0
    x, v = torch.randn(6, 3), torch.randn(6, 3)
    out = sampler.step(v, 3, x, generator=torch.Generator().manual_seed(0))
    expected = torch.distributions.Normal(out.mean, out.std.expand_as(out.mean)).log_prob(out.prev_sample).sum(-1)
    torch.testing.assert_close(out.log_prob, expected, rtol=1e-5, atol=1e-4)
