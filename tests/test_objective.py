"""Each GRPO function against an independent computation (loops / numpy / torch.distributions)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import Normal, kl_divergence

from margrpo.grpo import (
    consistency_mask,
    group_advantages,
    kl_gaussian,
    kl_paper,
    masked_mean,
    mte_loss,
    per_token_policy_objective,
    policy_ratio_stats,
    uncertainty_mask,
)


def policy_loss(log_prob, old_log_prob, advantages, mask, clip_eps):
    """One chosen step's policy loss as the trainer composes it (`GRPOTrainer.micro_loss`): minus the masked mean
    of the clipped surrogate, and its ratio stats."""
    objective = per_token_policy_objective(log_prob, old_log_prob, advantages, clip_eps)
    return -masked_mean(objective, mask), policy_ratio_stats(log_prob, old_log_prob, advantages, mask, clip_eps)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------- advantages


@pytest.mark.parametrize("group_size", [1, 2, 4, 6])
def test_group_advantages_match_numpy_unbiased_std(group_size):
    rewards = torch.rand(5 * group_size, generator=gen(1))
    adv, frac = group_advantages(rewards, group_size)
    r = rewards.double().numpy().reshape(-1, group_size)
    expected = []
    for g in r:
        if np.all(g == g[0]):
            expected.extend([0.0] * group_size)
        else:
            expected.extend(
                (g - g.mean()) / (np.std(g, ddof=1) + 1e-4)
            )  # ddof = 1: torch's default, the official code's
    assert adv.shape == rewards.shape and adv.dtype == torch.float32
    np.testing.assert_allclose(adv.numpy(), np.array(expected), rtol=1e-6, atol=1e-6)
    assert frac == (1.0 if group_size == 1 else 0.0)


def test_tied_groups_get_exactly_zero_advantage_and_are_counted():
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.0, 1.0, 0.5, 7.0, 7.0, 7.0])  # 0.1: not exact in binary
    adv, frac = group_advantages(rewards, 3)
    assert torch.equal(adv[:3], torch.zeros(3)) and torch.equal(adv[6:], torch.zeros(3))
    assert adv[3:6].abs().sum() > 0
    assert frac == pytest.approx(2 / 3)


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), 4)
    bad = torch.tensor([0.0, float("nan"), 1.0, 2.0, float("inf"), 3.0])
    with pytest.raises(ValueError, match=r"2 non-finite reward\(s\) at indices \[1, 4\] \(groups \[0, 1\]\)"):
        group_advantages(bad, 3)


# ---------------------------------------------------------------------------------- policy loss


def reference_loss(lp, old, adv, mask, eps):
    """Loop over tokens with Python floats: -(sum l * m) / (sum m)."""
    num = den = 0.0
    B, L = lp.shape
    for b in range(B):
        for j in range(L):
            m = float(mask[b, j])
            if m == 0:
                continue
            r = math.exp(float(lp[b, j]) - float(old[b, j]))
            a = float(adv[b])
            objective = min(r * a, min(max(r, 1 - eps), 1 + eps) * a)
            num += objective * m
            den += m
    return -num / den


@pytest.mark.parametrize("weighted", [False, True])
def test_policy_loss_matches_loop(weighted):
    g = gen(2)
    lp = torch.randn(3, 5, generator=g) * 0.3
    old = lp + torch.randn(3, 5, generator=g) * 0.3
    adv = torch.randn(3, generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.3
    mask = mask * torch.rand(3, 5, generator=g) if weighted else mask
    loss, stats = policy_loss(lp, old, adv, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx(reference_loss(lp, old, adv, mask, 0.2), rel=1e-5, abs=1e-6)
    ratio = torch.exp(lp - old)[mask != 0]
    assert stats["ratio_min"] == pytest.approx(ratio.min().item())
    assert stats["ratio_max"] == pytest.approx(ratio.max().item())
    assert stats["ratio_mean"] == pytest.approx(ratio.mean().item())


def test_unchanged_params_give_minus_mean_advantage_and_no_clipping():
    g = gen(3)
    old = torch.randn(4, 6, generator=g)
    lp = old.clone().requires_grad_()
    adv = torch.tensor([1.0, -2.0, 0.5, 3.0])
    mask = torch.tensor([[1] * 6, [1, 1, 0, 0, 0, 0], [0] * 6, [1, 0, 1, 0, 1, 0]], dtype=torch.bool)
    loss, stats = policy_loss(lp, old, adv, mask, clip_eps=0.1)
    expected = -(adv[:, None] * mask).sum() / mask.sum()  # mean of A over masked tokens
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert stats == {"clip_frac": 0.0, "ratio_min": 1.0, "ratio_max": 1.0, "ratio_mean": 1.0}


@pytest.mark.parametrize(
    "a, delta, clipped",
    [
        (1.0, 0.5, True),  # A > 0, r > 1 + eps: clipped at (1 + eps) A, no gradient
        (1.0, -0.5, False),  # A > 0, r < 1 - eps: min keeps r A, gradient flows
        (-1.0, -0.5, True),  # A < 0, r < 1 - eps: clipped at (1 - eps) A, no gradient
        (-1.0, 0.5, False),  # A < 0, r > 1 + eps: min keeps r A (pessimistic), gradient flows
        (1.0, 0.05, False),  # inside the clip range
    ],
)
def test_clipping_direction(a, delta, clipped):
    eps = 0.2
    old = torch.zeros(1, 1)
    lp = torch.full((1, 1), delta, requires_grad=True)
    adv = torch.tensor([a])
    loss, stats = policy_loss(lp, old, adv, torch.ones(1, 1, dtype=torch.bool), clip_eps=eps)
    loss.backward()
    r = math.exp(delta)
    if clipped:
        bound = 1 + eps if a > 0 else 1 - eps
        assert loss.item() == pytest.approx(-bound * a)
        assert lp.grad.item() == 0.0
        assert stats["clip_frac"] == 1.0
    else:
        assert loss.item() == pytest.approx(-r * a)
        assert lp.grad.item() == pytest.approx(-a * r)  # d(-r A)/d lp
        assert stats["clip_frac"] == 0.0


def test_reinforce_form_value_and_gradient():
    g = gen(4)
    theta = torch.randn(3, 4, generator=g, requires_grad=True)
    x = torch.randn(3, 4, generator=g)
    adv = torch.randn(3, generator=g)
    mask = torch.rand(3, 4, generator=g) > 0.4
    lp = theta * x  # d lp / d theta = x
    old = torch.randn(3, 4, generator=g)  # ignored by the REINFORCE form
    loss, stats = policy_loss(lp, old, adv, mask, clip_eps=None)
    loss.backward()
    n = mask.sum()
    assert loss.item() == pytest.approx((-(adv[:, None] * mask).sum() / n).item(), rel=1e-6)
    expected_grad = -(adv[:, None] * x * mask) / n  # -(A * grad lp) averaged over masked tokens
    torch.testing.assert_close(theta.grad, expected_grad)
    assert stats["clip_frac"] == 0.0


def test_empty_mask_gives_zero_loss_without_nan():
    lp = torch.randn(2, 3, requires_grad=True)
    bad = lp * torch.tensor([[1.0, float("nan"), 1.0], [1.0, 1.0, float("inf")]])  # garbage off-mask
    loss, stats = policy_loss(bad, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3, dtype=torch.bool), 0.2)
    assert loss.item() == 0.0 and loss.requires_grad
    assert stats["clip_frac"] == 0.0 and math.isnan(stats["ratio_mean"])
    assert masked_mean(bad, torch.tensor([[True, False, True], [True, True, False]])).isfinite()


def test_objective_broadcasts_advantages_over_trajectories():
    g = gen(5)
    lp, old = torch.randn(2, 3, 4, generator=g), torch.randn(2, 3, 4, generator=g)
    adv = torch.randn(3, generator=g)
    obj = per_token_policy_objective(lp, old, adv, 0.2)
    assert obj.shape == (2, 3, 4)
    for s in range(2):
        torch.testing.assert_close(obj[s], per_token_policy_objective(lp[s], old[s], adv, 0.2))
    with pytest.raises(ValueError, match="advantages"):
        per_token_policy_objective(lp, old, torch.zeros(4), 0.2)


# ---------------------------------------------------------------------------------- KL


def test_kl_paper_matches_numpy():
    g = gen(6)
    mean, ref = torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    d = ref.double().numpy() - mean.double().numpy()
    expected = (np.exp(d) - d - 1).sum(axis=-1)  # per token, summed over channels like the log-prob
    out = kl_paper(mean, ref)
    assert out.shape == (2, 5)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)
    assert torch.equal(kl_paper(mean, mean), torch.zeros(2, 5))
    shifted = mean + 1e-4
    d = (shifted - mean).double()  # the float32 d exactly, ~1e-4
    expected_tiny = (d**2 / 2 + d**3 / 6).sum(-1).float()  # Taylor: exp(d) - d - 1, ~5e-9 per channel
    tiny = kl_paper(mean, shifted)  # expm1: ~1e-3 relative error here; exp(d) - d - 1 is ~100% off
    torch.testing.assert_close(tiny, expected_tiny, rtol=3e-3, atol=0)


@pytest.mark.parametrize("std_kind", ["float", "scalar_tensor", "per_token"])
def test_kl_gaussian_matches_torch_distributions(std_kind):
    g = gen(7)
    mean, ref = torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    stds = {"float": 0.7, "scalar_tensor": torch.tensor(0.7), "per_token": torch.rand(2, 5, 1, generator=g) + 0.1}
    std = stds[std_kind]
    std_full = torch.as_tensor(std).expand_as(mean)
    expected = kl_divergence(Normal(mean, std_full), Normal(ref, std_full)).sum(-1)
    torch.testing.assert_close(kl_gaussian(mean, ref, std), expected)


@pytest.mark.parametrize("ref_kind", ["per_channel", "per_token"])
def test_kl_gaussian_with_two_sigmas_matches_torch_distributions(ref_kind):
    """Learned variance: the exact KL of the two Gaussians, log-sigma terms included."""
    g = gen(17)
    mean, ref = torch.randn(2, 5, 4, generator=g), torch.randn(2, 5, 4, generator=g)
    std = torch.rand(2, 5, 4, generator=g) + 0.2
    ref_std = torch.rand(2, 5, 4 if ref_kind == "per_channel" else 1, generator=g) + 0.2
    expected = kl_divergence(Normal(mean, std), Normal(ref, ref_std.expand_as(mean))).sum(-1)
    torch.testing.assert_close(kl_gaussian(mean, ref, std, ref_std), expected)


def test_kl_gaussian_does_not_reward_inflating_sigma():
    """With equal means, the KL grows as the policy's sigma leaves the reference's, in either direction;
    the mean-only form ||d||^2 / (2 sigma^2) would fall as sigma grows."""
    mean = torch.zeros(1, 1, 3)
    ref_std = torch.full((1, 1, 3), 0.5)
    kls = [kl_gaussian(mean, mean, torch.full((1, 1, 3), s), ref_std).item() for s in (0.25, 0.5, 1.0, 2.0)]
    assert kls[1] == pytest.approx(0.0, abs=1e-7) and kls[0] > 0 and kls[3] > kls[2] > 0
    sigma = torch.full((1, 1, 3), 1.0, requires_grad=True)
    kl_gaussian(mean + 0.1, mean, sigma, ref_std).sum().backward()
    assert (sigma.grad > 0).all()  # gradient descent on the KL shrinks an inflated sigma


def test_kl_gaussian_refuses_ambiguous_std():
    with pytest.raises(ValueError, match="std"):
        kl_gaussian(torch.zeros(2, 4, 4), torch.zeros(2, 4, 4), torch.ones(2, 4))


# ---------------------------------------------------------------------------------- MTE


def reference_uncertainty_mask(latents, top_frac, candidates):
    S, B, L, D = latents.shape
    x = latents.double().numpy()
    out = np.zeros((B, L), dtype=bool)
    for b in range(B):
        u = [np.std(x[:, b, j, :], axis=0).mean() for j in range(L)]  # ddof = 0
        cand = [j for j in range(L) if candidates[b, j]]
        k = math.floor(top_frac * len(cand) + 0.5)  # nearest, halves up
        for j in sorted(cand, key=lambda j: (-u[j], j))[:k]:  # ties: lower index first
            out[b, j] = True
    return torch.from_numpy(out)


@pytest.mark.parametrize("top_frac", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("use_candidates", [False, True])
def test_uncertainty_mask_matches_loop(top_frac, use_candidates):
    g = gen(8)
    latents = torch.randn(4, 3, 10, 2, generator=g)
    cand = torch.rand(3, 10, generator=g) > 0.4 if use_candidates else torch.ones(3, 10, dtype=torch.bool)
    out = uncertainty_mask(latents, top_frac, cand if use_candidates else None)
    assert out.dtype == torch.bool and out.shape == (3, 10)
    assert torch.equal(out, reference_uncertainty_mask(latents, top_frac, cand))


def test_uncertainty_mask_counts_and_ties():
    latents = torch.randn(1, 2, 10, 3, generator=gen(9))  # S = 1: u = 0 everywhere, all tied
    out = uncertainty_mask(latents, 0.3)
    assert torch.equal(out[0], torch.arange(10) < 3) and torch.equal(out[1], out[0])
    assert uncertainty_mask(latents, 0.0).sum() == 0 and uncertainty_mask(latents, 1.0).all()
    assert uncertainty_mask(latents, 0.25)[0].sum() == 3  # 2.5 rounds half up
    assert uncertainty_mask(latents, 0.7)[0].sum() == 7


def test_mte_loss_matches_loop_and_reduces_exactly():
    g = gen(10)
    per_traj = torch.randn(3, 2, 4, generator=g)
    mask = torch.rand(2, 4, generator=g) > 0.5
    out = mte_loss(per_traj, mask)
    for b in range(2):
        for j in range(4):
            expected = per_traj[:, b, j].mean() if mask[b, j] else per_traj[0, b, j]
            assert out[b, j].item() == pytest.approx(expected.item())
    assert torch.equal(mte_loss(per_traj[:1], mask), per_traj[0])
    assert torch.equal(mte_loss(per_traj, torch.zeros(2, 4, dtype=torch.bool)), per_traj[0])


# ---------------------------------------------------------------------------------- Sim


def test_consistency_mask_matches_loop():
    g = gen(11)
    prev, cur, final = (torch.randn(2, 6, 5, generator=g) for _ in range(3))
    committed = torch.zeros(2, 6, dtype=torch.bool)
    committed[0, 1] = committed[1, 4] = True
    tau = 0.1
    out = consistency_mask(prev, cur, final, committed, tau)

    def cos(a, b):
        return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    for b in range(2):
        for j in range(6):
            f = final[b, j].numpy()
            keep = cos(cur[b, j].numpy(), f) - cos(prev[b, j].numpy(), f) > tau or bool(committed[b, j])
            assert bool(out[b, j]) == keep
    assert consistency_mask(prev, cur, final, committed, -math.inf).all()


# ---------------------------------------------------------------------------------- reductions


def _combined_case(S, top_frac, tau, seed=12):
    """Plain GRPO loss and the +MTE +Sim loss on the same data; grads w.r.t. the committed lp.

    B * L = 32 keeps elementwise kernels free of scalar tails, so [S, B, L] and [B, L] inputs
    take the same code path and bitwise comparison is meaningful.
    """
    B, L, D, S_max = 4, 8, 3, 3
    g = gen(seed)
    base = torch.randn(S_max, B, L, generator=g)
    old = base + 0.2 * torch.randn(S_max, B, L, generator=g)
    adv = torch.randn(B, generator=g)
    completion = torch.rand(B, L, generator=g) > 0.3
    latents = torch.randn(S_max, B, L, D, generator=g)
    x0_prev, x0_cur, x_final = (torch.randn(B, L, D, generator=g) for _ in range(3))

    lp_plain = base[0].clone().requires_grad_()
    plain, _ = policy_loss(lp_plain, old[0], adv, completion, clip_eps=0.2)
    plain.backward()

    lp = base[:S].clone().requires_grad_()
    obj = per_token_policy_objective(lp, old[:S], adv, clip_eps=0.2)  # [S, B, L]
    obj = mte_loss(obj, uncertainty_mask(latents[:S], top_frac, candidates=completion))  # [B, L]
    kappa = consistency_mask(x0_prev, x0_cur, x_final, completion, tau)  # [B, L]
    combined = -masked_mean(obj, completion & kappa)
    combined.backward()
    return plain, combined, lp_plain.grad, lp.grad


@pytest.mark.parametrize(
    "S, top_frac",
    [(1, 0.3), (3, 0.0)],
    ids=["S=1", "k=0"],
)
def test_mte_and_sim_reductions_give_plain_loss_exactly(S, top_frac):
    plain, combined, grad_plain, grad = _combined_case(S, top_frac, tau=-math.inf)
    assert torch.equal(combined, plain)
    assert torch.equal(grad[0], grad_plain)
    assert torch.count_nonzero(grad[1:]) == 0


def test_mte_active_changes_the_loss():
    plain, combined, _, grad = _combined_case(3, 0.5, tau=-math.inf)
    assert not torch.equal(combined, plain)
    assert torch.count_nonzero(grad[1:]) > 0  # the extra trajectories receive gradient


def test_masked_mean_with_a_batch_count_sums_over_micro_batches_to_the_batch_mean():
    g = gen(21)
    values, weight = (
        torch.randn(3, 8, 5, generator=g),
        torch.rand(8, 5, generator=g) * (torch.rand(8, 5, generator=g) > 0.3),
    )
    whole = masked_mean(values, weight)
    count = weight.expand_as(values).sum()
    parts = [masked_mean(values[:, rows], weight[rows], count) for rows in (slice(0, 3), slice(3, 4), slice(4, 8))]
    torch.testing.assert_close(sum(parts), whole, rtol=1e-6, atol=0)
    assert masked_mean(values, torch.zeros(8, 5), 0.0) == 0
