"""Issue 62: the estimators' statistics (margrpo.reporting.estimators) and the batch gradient they read
(margrpo.grpo.gradient_estimates): the paired noise ratio of an estimator against itself is 1, a stand-in of halved
variance is found as such, the formulas agree with their definitions, and the batch gradient is the trainer's own."""

import math

import numpy as np
import pytest
import torch
from helpers import make_trainer, tiny_policy

from margrpo.grpo.gradient_estimates import batch_gradient, flat_grad
from margrpo.reporting.estimators import (
    Batches,
    batches_for_cosine,
    bootstrap,
    cos_mean,
    describe,
    estimator_claims,
    noise,
    ratio_of,
    signal_square,
)


def batches(G: np.ndarray, exact: np.ndarray, name: str = "fix", cpu: float = 1.0) -> Batches:
    """An estimator's record from its batch gradients G [B, P] and the exact direction."""
    u = exact / np.linalg.norm(exact)
    return Batches(name, G @ G.T, G @ u, np.full(len(G), cpu), 24, True)


def stand_ins(B=48, P=2000, signal=0.3, scale=1.0, seed=0):
    """B batch gradients: a fixed signal along the first axis, and independent noise of variance scale^2 each."""
    rng = np.random.default_rng(seed)
    s = np.zeros(P)
    s[0] = signal
    return s + scale * rng.standard_normal((B, P)), s


def test_the_statistics_agree_with_their_definitions():
    G, s = stand_ins()
    b = batches(G, s)
    assert noise(b) == pytest.approx(np.trace(np.cov(G.T)), rel=1e-9)  # tr Cov g
    assert signal_square(b) == pytest.approx(np.sum(G.mean(0) ** 2) - noise(b) / len(G), rel=1e-9)
    mean = G.mean(0)
    assert cos_mean(b) == pytest.approx(mean[0] / np.linalg.norm(mean), rel=1e-9)
    assert noise(b) == pytest.approx(G.shape[1], rel=0.05)
    # with signal a along the exact direction, the mean of n batches has cos a / sqrt(|E g|^2 + tr Cov g / n)
    G, s = stand_ins(B=64, P=200, signal=2.0)
    b, a = batches(G, s), 2.0
    n = batches_for_cosine(b, a)
    assert math.isfinite(n) and a / math.sqrt(max(signal_square(b), a * a) + noise(b) / n) == pytest.approx(0.5)
    assert batches_for_cosine(b, -a) == math.inf  # no signal along it: never


def test_an_estimator_against_itself_has_a_noise_ratio_of_one():
    G, s = stand_ins()
    b = batches(G, s)
    value, lo, hi = bootstrap(ratio_of(noise), [b, b], 0.95)
    assert value == 1.0 and lo <= 1.0 <= hi


def test_a_stand_in_of_halved_variance_is_detected_as_such():
    G, s = stand_ins(seed=0)
    H, _ = stand_ins(seed=1, scale=math.sqrt(0.5))  # the same signal, independent noise of half the variance
    fix, half = batches(G, s, "fix"), batches(H, s, "mte")
    value, lo, hi = bootstrap(ratio_of(noise), [half, fix], 0.95)
    assert lo < 0.5 < hi and hi < 1.0, (value, lo, hi)
    (h,) = [r for r in estimator_claims({"fix": fix, "mte": half}, "stand-ins", 0.95) if r["claim"] == "h"]
    assert h["verdict"] == "reproduced" and h["lo"] < 0.5 < h["hi"]
    # the same variance is not called lower
    same, _ = stand_ins(seed=2)
    (h,) = estimator_claims({"fix": fix, "mte": batches(same, s, "mte")}, "stand-ins", 0.95)
    assert h["verdict"] == "not settled" and h["lo"] < 1.0 < h["hi"]


def test_describe_reports_the_images_a_cosine_of_a_half_needs():
    G, s = stand_ins(B=64, P=200, signal=2.0, scale=1.0)  # a signal that 64 batches detect
    row = describe(batches(G, s), 0.95)
    assert row["proj_mean"] == pytest.approx(2.0, abs=4 * row["proj_se"])
    # cos 0.5 at n = tr Cov / (3 a^2) batches of 24 images, for a signal all along the exact direction
    assert row["images_for_cos_half"] == pytest.approx(24 * 200 / (3 * 4.0), rel=0.35)
    assert row["noise_lo"] < 200 < row["noise_hi"]


def test_the_batch_gradient_is_the_one_the_trainer_s_update_follows(tmp_path):
    """batch_gradient replays the trainer's own backward passes: the gradient `update` leaves in .grad (unclipped)
    is the same, and the parameters and .grad are left as they were."""
    a = make_trainer(tmp_path / "a", policy=tiny_policy(seed=3), grad_clip=0.0, freeze_head=True)
    b = make_trainer(tmp_path / "b", policy=tiny_policy(seed=3), grad_clip=0.0, freeze_head=True)
    before = [p.detach().clone() for p in b.params]
    g, rewards = batch_gradient(b, step=0)
    assert all(torch.equal(p, q) for p, q in zip(b.params, before)) and all(p.grad is None for p in b.params)
    a.step = 0
    batch = a.rollout_and_score()
    a.update(batch, a.plan_updates(batch)[0])
    assert torch.equal(rewards, batch.rewards)
    torch.testing.assert_close(g, flat_grad(a.params), rtol=0, atol=0)
    assert g.norm() > 0


def test_grpo_s_ar_gradient_is_fix_s_at_the_base(tmp_path):
    """Why the estimators' table has no GRPO row: at the base, GRPO's gradient on the AR part is +Fix's (the same
    rollout and loss; the head's gradient is the rest)."""
    fix = make_trainer(tmp_path / "fix", policy=tiny_policy(seed=4), grad_clip=0.0, freeze_head=True)
    grpo = make_trainer(tmp_path / "grpo", policy=tiny_policy(seed=4), grad_clip=0.0)
    g_fix, _ = batch_gradient(fix, step=1)
    g_grpo, _ = batch_gradient(grpo, step=1)
    ar = {id(p) for p in fix.params}
    names = {id(p): n for n, p in grpo.policy.named_parameters()}
    fix_names = {id(p): n for n, p in fix.policy.named_parameters()}
    offsets, at = {}, 0
    for p in grpo.params:
        offsets[names[id(p)]] = (at, p.numel())
        at += p.numel()
    pieces = [g_grpo[offsets[fix_names[id(p)]][0] :][: p.numel()] for p in fix.params]
    assert len(ar) < len(grpo.params)  # GRPO also trains the head
    torch.testing.assert_close(torch.cat(pieces), g_fix, rtol=1e-5, atol=1e-7)
