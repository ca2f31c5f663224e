"""The discrete toy-mask policy, its MaskGIT rollout record, plain GRPO with exact log-probs and MaskGRPO."""

import math
from functools import partial

import numpy as np
import pytest
import torch
from helpers import redness

from margrpo.grpo.rollout import unknown_after_steps
from margrpo.prompts.suites import PromptSet
from margrpo.related.maskgrpo.policy import ToyMaskConfig, ToyMaskPolicy
from margrpo.related.maskgrpo.pretraining import MaskPretrainConfig, pretrain_mask_policy
from margrpo.related.maskgrpo.rollout import MaskSamplingConfig, generate
from margrpo.related.maskgrpo.trainer import (
    MaskGRPOConfig,
    kl_terms,
    mask_ratios,
    plan_targets,
    recorded_log_probs,
    remask,
    surrogate_loss,
    token_log_probs,
    train_mask_grpo,
)
from margrpo.stages._related import load_any_policy
from margrpo.world import WorldConfig, parse, prompt_vocabulary, render, sample_scene

torch.set_num_threads(1)
PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a yellow circle"]
TINY = dict(width=32, depth=1, heads=2, text_width=16, text_depth=1, text_heads=2, vocab=prompt_vocabulary())


def tiny(world: WorldConfig | None = None, seed: int = 0) -> ToyMaskPolicy:
    torch.manual_seed(seed)
    kw = dict(TINY, world=world.to_dict()) if world else TINY
    return ToyMaskPolicy(ToyMaskConfig(**kw)).eval()


def perturb(policy: ToyMaskPolicy, scale: float = 0.3, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.rl_parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def rollout(policy, sampling=None, group=2, seed=0):
    sampling = sampling or MaskSamplingConfig(cfg_scale=2.0, temperature=0.7)
    return generate(policy, PROMPTS, sampling, group, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("selection", ["random", "confidence"])
def test_rollout_record_is_consistent(selection):
    """Each position is committed exactly once, on the cosine schedule, and the committed draw is the final token."""
    policy = tiny()
    r = rollout(policy, MaskSamplingConfig(steps=6, selection=selection))
    K, N, L = r.masked.shape
    assert (r.committed.sum(0) == 1).all()
    left = [L] + unknown_after_steps(L, K)
    assert r.committed.sum(2).tolist() == [[left[k] - left[k + 1]] * N for k in range(K)]
    assert (r.masked.sum(2)[:, 0] == torch.tensor(left[:-1])).all()
    assert torch.equal(r.sampled[r.committed], r.tokens.expand(K, N, L)[r.committed])
    assert (r.tokens < policy.vocab_size).all() and r.images.shape == (N, 3, 64, 64)


def test_log_probs_equal_categorical():
    """token_log_probs (batched over steps, CFG in one pass) = Categorical(guided logits / T).log_prob, computed
    apart."""
    policy = tiny()
    perturb(policy)  # non-trivial logits
    sampling = MaskSamplingConfig(cfg_scale=2.5, temperature=0.7)
    r = rollout(policy, sampling)
    steps = torch.tensor([0, 3, 7])
    lp, _ = token_log_probs(policy, r.prompts, r.tokens, r.masked[steps], sampling)
    cond, uncond = policy.encode_prompts(r.prompts), policy.null_condition(len(r.prompts))
    with torch.no_grad():
        for m, k in enumerate(steps.tolist()):
            state = torch.where(r.masked[k], policy.mask_id, r.tokens)
            logits = policy.logits(state, uncond) + 2.5 * (policy.logits(state, cond) - policy.logits(state, uncond))
            want = torch.distributions.Categorical(logits=logits / 0.7).log_prob(r.tokens)
            torch.testing.assert_close(lp[m], want, atol=1e-5, rtol=0)
    assert lp.requires_grad and (lp < 0).all()


def test_cond_only_log_probs_are_the_conditional_branch_as_the_official_training_pass():
    """Issue 27.10: the official MaskGRPO training pass scores without CFG (mask_grpo_trainer.py l. 664-686)."""
    policy = tiny()
    perturb(policy)
    sampling = MaskSamplingConfig(cfg_scale=2.5, temperature=0.7)
    r = rollout(policy, sampling)
    masked = remask(r.tokens, 0.8, torch.Generator().manual_seed(0))[None]
    guided, _ = token_log_probs(policy, r.prompts, r.tokens, masked, sampling)
    cond_only, _ = token_log_probs(policy, r.prompts, r.tokens, masked, sampling, "cond_only")
    with torch.no_grad():
        logits = policy.logits(torch.where(masked[0], policy.mask_id, r.tokens), policy.encode_prompts(r.prompts))
        want = torch.distributions.Categorical(logits=logits / 0.7).log_prob(r.tokens)
    torch.testing.assert_close(cond_only[0], want, atol=1e-5, rtol=0)
    assert not torch.allclose(guided, cond_only, atol=1e-3)
    assert MaskGRPOConfig().logprob_cfg == "exact"


@pytest.mark.parametrize("method", ["grpo", "mask_grpo"])
def test_ratio_is_one_on_unchanged_parameters(method):
    policy = tiny()
    r = rollout(policy)
    cfg = MaskGRPOConfig(method=method, iterations=3)
    targets = plan_targets(cfg, r, torch.Generator().manual_seed(0))
    adv = torch.randn(len(r.prompts))
    for t in targets:
        with torch.no_grad():
            old, _ = token_log_probs(policy, r.prompts, r.tokens, t.masked, r.sampling)
        lp, logp = token_log_probs(policy, r.prompts, r.tokens, t.masked, r.sampling)
        _, stats = surrogate_loss(cfg, lp, logp, old, (old, logp.detach()), adv, t.weights)
        assert stats["ratio_min"] == stats["ratio_max"] == 1.0 and stats["clip_frac"] == 0.0
        assert abs(stats["kl"]) < 1e-7
    if method == "grpo":  # the recomputation reproduces the rollout's own log-probs of the committed tokens
        steps = torch.arange(r.masked.shape[0])
        lp, _ = token_log_probs(policy, r.prompts, r.tokens, r.masked[steps], r.sampling)
        ratio = torch.exp(lp - recorded_log_probs(r, steps))[r.committed]
        assert (ratio - 1).abs().max() < 1e-5


def test_mask_grpo_ratio_is_exact_for_a_single_token_image():
    """One cell: the ELBO of the image is its log-likelihood, so MaskGRPO's ratio is the exact image ratio."""
    policy = tiny(WorldConfig(image_size=32, grid=1, max_objects=1))
    r = generate(policy, PROMPTS, MaskSamplingConfig(steps=1, cfg_scale=2.0), 4, torch.Generator().manual_seed(0))
    old_exact = recorded_log_probs(r, torch.tensor([0]))[0, :, 0]  # [N] log p(image)
    masked = remask(r.tokens, 0.6, torch.Generator().manual_seed(3))[None]
    assert masked.all()
    with torch.no_grad():
        old_est, _ = token_log_probs(policy, r.prompts, r.tokens, masked, r.sampling)
    perturb(policy)
    new_exact, _ = token_log_probs(policy, r.prompts, r.tokens, r.masked[[0]], r.sampling)
    new_est, _ = token_log_probs(policy, r.prompts, r.tokens, masked, r.sampling)
    exact, est = torch.exp(new_exact[0, :, 0] - old_exact), torch.exp(new_est[0, :, 0] - old_est[0, :, 0])
    torch.testing.assert_close(est, exact, atol=1e-5, rtol=1e-5)
    assert (exact - 1).abs().max() > 1e-2  # the perturbation moved the policy


def test_mask_grpo_ratio_equals_grpo_ratio_where_one_token_is_masked():
    """K = L: the last step sees one masked token; re-masking just that token gives GRPO's exact ratio there."""
    policy = tiny()
    sampling = MaskSamplingConfig(steps=16, cfg_scale=2.0)
    r = rollout(policy, sampling)
    last = r.committed[-1]  # [N, L], one token per image
    assert (last.sum(1) == 1).all()
    with torch.no_grad():
        old_est, _ = token_log_probs(policy, r.prompts, r.tokens, last[None], sampling)
    perturb(policy)
    lp_grpo, _ = token_log_probs(policy, r.prompts, r.tokens, r.masked[[15]], sampling)
    lp_est, _ = token_log_probs(policy, r.prompts, r.tokens, last[None], sampling)
    grpo = torch.exp(lp_grpo[0] - r.log_probs[15])[last]
    est = torch.exp(lp_est[0] - old_est[0])[last]
    torch.testing.assert_close(est, grpo, atol=1e-5, rtol=1e-5)
    assert (grpo - 1).abs().max() > 1e-2


def test_mask_ratios_and_remask():
    assert mask_ratios(6, 0.6) == pytest.approx([0.6 + 0.4 * i / 6 for i in range(1, 6)] + [0.999])
    tokens = torch.zeros(200, 16, dtype=torch.long)
    masked = remask(tokens, 0.0, torch.Generator().manual_seed(0))
    assert (masked.sum(1) == 1).all()  # never an image without a scored token
    frac = remask(tokens, 0.7, torch.Generator().manual_seed(0)).float().mean().item()
    assert abs(frac - 0.7) < 0.03


def test_kl_terms_vanish_at_the_reference_and_grow_away_from_it():
    logp = torch.log_softmax(torch.randn(2, 3, 5, 7), -1)
    other = torch.log_softmax(torch.randn(2, 3, 5, 7), -1)
    tokens = torch.randint(7, (2, 3, 5, 1))
    lp, lo = logp.gather(-1, tokens)[..., 0], other.gather(-1, tokens)[..., 0]
    for kind in ("k3", "exact"):
        assert kl_terms(lp, logp, lp, logp, kind).abs().max() < 1e-6
        assert (kl_terms(lp, logp, lo, other, kind) >= -1e-6).all() and kl_terms(
            lp, logp, lo, other, kind
        ).mean() > 1e-3
    exact = (logp.exp() * (logp - other)).sum(-1)
    torch.testing.assert_close(kl_terms(lp, logp, lo, other, "exact"), exact)


def test_pretraining_lowers_the_loss():
    policy = tiny()
    rows = pretrain_mask_policy(policy, MaskPretrainConfig(steps=30, batch_size=16, lr=3e-3, warmup_steps=2))
    first, last = rows[0]["loss"], np.mean([r["loss"] for r in rows[-5:]])
    assert first > math.log(policy.vocab_size) - 0.5  # starts near the uniform categorical
    assert last < 0.5 * first and not policy.training


def test_save_load_round_trip(tmp_path):
    policy = tiny()
    perturb(policy)
    policy.save_pretrained(tmp_path / "p")
    loaded = load_any_policy(tmp_path / "p")  # the stages dispatch toy-mask (the policy package must not import it)
    assert isinstance(loaded, ToyMaskPolicy)
    tokens = torch.randint(policy.vocab_size + 1, (4, policy.seq_len))
    with torch.no_grad():
        a, b = (
            policy.logits(tokens, policy.encode_prompts(PROMPTS + ["x"])),
            loaded.logits(tokens, loaded.encode_prompts(PROMPTS + ["x"])),
        )
    assert torch.equal(a, b)
    ra, rb = rollout(policy, seed=5), rollout(loaded, seed=5)
    assert torch.equal(ra.tokens, rb.tokens) and torch.equal(ra.log_probs, rb.log_probs)


def test_decode_encode_renders_the_same_scene():
    rng = np.random.default_rng(0)
    exact_world = WorldConfig(image_size=64, grid=4, size_range=(12, 12))  # the codebook's canonical size
    policy = tiny(exact_world)
    scenes = [sample_scene(rng, exact_world) for _ in range(20)]
    images = (policy.decode(policy.encode_scenes(scenes)) * 255).round().byte().permute(0, 2, 3, 1).numpy()
    for scene, image in zip(scenes, images):
        assert np.array_equal(image, render(scene, exact_world))  # pixel for pixel the renderer's
    tokens = torch.randint(policy.vocab_size, (8, policy.seq_len))
    assert torch.equal(policy.encode(policy.decode(tokens)), tokens)
    default = tiny()  # sizes 11-12: the size is lost, what the parser reads is not
    for scene in [sample_scene(rng, default.world) for _ in range(20)]:
        image = (default.decode(default.encode_scenes([scene]))[0] * 255).round().byte().permute(1, 2, 0).numpy()
        got = [(o["color"], o["shape"], o["texture"]) for o in parse(image, default.world)]
        want = [(o["color"], o["shape"], o["texture"]) for o in parse(render(scene, default.world), default.world)]
        assert got == want and len(got) == len(scene.objects)


@pytest.mark.parametrize("method,logprob_cfg", [("grpo", "exact"), ("mask_grpo", "exact"), ("mask_grpo", "cond_only")])
def test_a_few_steps_run_and_log_finite_metrics(method, logprob_cfg):
    policy = tiny()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    prompts = PromptSet(PROMPTS, [{"i": i} for i in range(3)])
    cfg = MaskGRPOConfig(
        method=method,
        steps=2,
        batch_prompts=2,
        group_size=3,
        iterations=2,
        val_every=1,
        val_prompts=3,
        lr=1e-3,
        logprob_cfg=logprob_cfg,
    )
    rows = train_mask_grpo(policy, partial(redness, against=1), prompts, cfg, val_prompts=prompts)  # red - green
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in (
            "reward_mean",
            "reward_std",
            "reward/redness",
            "policy_loss",
            "kl",
            "ratio_min",
            "ratio_max",
            "clip_frac",
            "grad_norm_ar",
            "step_time_s",
            "val_reward",
            "frac_zero_std",
            "adv_mean",
        ):
            assert math.isfinite(row[key]), key
        assert row["skipped"] == 0
    assert rows[0]["ratio_min"] <= 1.0 <= rows[0]["ratio_max"]
    changed = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert "out.weight" in changed and "blocks.0.attn.qkv.weight" in changed
    assert not any(n.startswith("text_encoder.") for n in changed)  # frozen in RL


def test_config_rejects_unknown_options():
    with pytest.raises(ValueError, match="Unknown method"):
        MaskGRPOConfig(method="ppo")
    with pytest.raises(ValueError, match="Unknown kl"):
        MaskGRPOConfig(kl="k2")
    with pytest.raises(ValueError, match="Unknown logprob_cfg"):
        MaskGRPOConfig(logprob_cfg="uncond")
    with pytest.raises(ValueError, match="Unknown selection"):
        MaskSamplingConfig(selection="greedy")
    with pytest.raises(ValueError, match="snapped world"):
        ToyMaskConfig(world=WorldConfig(snap=False, max_objects=2).to_dict())


def test_mask_steps_means_what_grpo_mask_steps_means():
    """|M| of the K unmasking steps, 1 <= |M| <= K, as grpo.mask_steps: no value stands for "every step"."""
    with pytest.raises(ValueError, match="must be >= 1"):
        MaskGRPOConfig(mask_steps=0)
    policy, g = tiny(), torch.Generator().manual_seed(0)
    r = rollout(policy, MaskSamplingConfig(steps=4, cfg_scale=2.0))
    assert len(plan_targets(MaskGRPOConfig(mask_steps=4, iterations=1), r, g)) == 1
    with pytest.raises(ValueError, match="mask_steps .M. = 5 exceeds the 4 unmasking steps"):
        plan_targets(MaskGRPOConfig(mask_steps=5, iterations=1), r, g)
