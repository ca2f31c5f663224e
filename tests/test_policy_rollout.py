"""design.md §3.1, §3.2, §3.6, §3.9: the rollout record reproduces its own log-probs (ratio == 1). The policy contract
(tests/policy_contract.py) runs on the toy's two heads; the tests here go beyond it: MTE's draws, subsets of steps,
CFG, shared noise and order, steps recorded in part."""

import types
from functools import partial

import pytest
import torch
from helpers import PROMPTS, assert_ratio_is_one, tiny_policy
from policy_contract import PolicyContract

from margrpo.grpo.replay import recorded, replay
from margrpo.grpo.rollout import SamplingConfig, generate
from margrpo.policy import load_policy

SAMPLING = SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=3.0, cfg_schedule="linear", temperature=0.9)


# the policy contract (tests/policy_contract.py) on the toy's two heads, dropout on: it must not leak into rollout or
# replay
class TestToyFlowContract(PolicyContract):
    build = staticmethod(partial(tiny_policy, "flow", dropout=0.2))


class TestToyDDPMContract(PolicyContract):
    build = staticmethod(partial(tiny_policy, "ddpm", dropout=0.2))


def rollout(policy, seed=0, trajectories=1, sampling=SAMPLING, **kw):
    return generate(
        policy,
        PROMPTS[:2],
        sampling,
        group_size=2,
        generator=torch.Generator().manual_seed(seed),
        trajectories=trajectories,
        mte_generator=torch.Generator().manual_seed(seed + 99),
        **kw,
    )


def all_steps(r):
    K, T = r.sampling.ar_steps, r.sampling.diffusion_steps
    return torch.arange(K), torch.arange(T - 1)[None].repeat(K, 1)


def test_mte_replay_limited_to_the_uncertainty_mask_matches_the_full_replay():
    policy = tiny_policy("flow")
    r = rollout(policy, trajectories=3)
    ar, diff = all_steps(r)
    full = replay(policy, r, ar, diff, with_mte=True).mte_log_prob
    tokens = torch.rand(r.known.shape, generator=torch.Generator().manual_seed(1)) < 0.4  # [K, N, L]
    part = replay(policy, r, ar, diff, with_mte=True, mte_tokens=tokens).mte_log_prob
    inside = (~r.known[ar] & tokens[ar])[:, None, None].expand_as(full)
    assert inside.any() and (~inside).any()
    torch.testing.assert_close(part[inside], full[inside], atol=0, rtol=0)
    assert bool((part[~inside] == 0).all())


def test_mte_draws_every_predicted_token_at_the_chosen_steps_only():
    """Algorithm 2: at a chosen AR step, S - 1 more trajectories of every unknown token from the same z_k;
    none at the other steps; the committed trajectory and the images do not change."""
    policy = tiny_policy("flow")
    chosen = torch.tensor([0, 2])
    plain = rollout(policy)
    r = rollout(policy, trajectories=4, mte_steps=chosen)
    assert torch.equal(plain.latents, r.latents) and torch.equal(plain.log_probs, r.log_probs)
    assert torch.equal(r.mte_steps, chosen) and r.mte_states.shape[:2] == (2, 3) and r.trajectories == 4
    assert r.mte_slots().tolist() == [0, -1, 1, -1]
    for m, k in enumerate(chosen.tolist()):
        unknown = ~r.known[k]  # [N, L]
        finals = r.mte_states[m, :, -1]  # [S-1, N, L, D]
        assert (finals[:, unknown].abs().sum(-1) > 0).all()  # every predicted token has S - 1 draws
        assert (finals[:, ~unknown] == 0).all()
        assert (r.mte_log_probs[m][:, :-1][:, :, unknown] != 0).all()  # scored (the last step is deterministic)
        own = r.mte_finals()[m, 0]
        assert torch.equal(own[unknown], r.states[k, -1][unknown])  # the rollout's own sample is one of the S
        assert not torch.equal(finals[0][unknown], own[unknown])  # fresh noise: a different draw
    assert_ratio_is_one(policy, r)


def test_ratio_is_one_for_a_random_subset_of_steps():
    policy = tiny_policy("flow")
    r = rollout(policy)
    ar = torch.tensor([1, 3])
    diff = torch.tensor([[0, 2], [1, 3]])
    rp = replay(policy, r, ar, diff)
    old, _ = recorded(r, ar, diff)
    assert torch.allclose(rp.log_prob[rp.mask], old[rp.mask], atol=1e-5, rtol=0)


def test_cond_only_logprob_differs_under_cfg():
    """The official shortcut scores with the conditional branch only: the ratio is then not 1."""
    policy = tiny_policy("flow")
    r = rollout(policy)
    ar, diff = all_steps(r)
    rp = replay(policy, r, ar, diff, logprob_cfg="cond_only")
    old, _ = recorded(r, ar, diff)
    assert (rp.log_prob - old)[rp.mask].abs().max() > 1e-3


def test_extra_trajectories_leave_the_committed_rollout_unchanged():
    policy = tiny_policy("flow")
    plain = rollout(policy, trajectories=1)
    multi = rollout(policy, trajectories=4)  # every AR step by default
    assert torch.equal(plain.latents, multi.latents) and torch.equal(plain.log_probs, multi.log_probs)
    finals = multi.mte_finals()  # [K, S, N, L, D]
    assert finals.shape[:2] == (SAMPLING.ar_steps, 4)
    assert not torch.equal(finals[-1, 1], finals[-1, 0])


def test_cfg_linear_schedule_reaches_scale():
    policy = tiny_policy("flow")
    r = rollout(policy)
    assert r.cfg[-1] == pytest.approx(3.0) and (r.cfg.diff() >= 0).all() and r.cfg[0] > 1


def test_loading_a_toy_policy_imports_neither_transformers_nor_diffusers(tmp_path):
    """Every toy train and sample job loads a policy: importing Harmon's and NOVA's modules to recognise their folders
    cost each job 3-4 CPU-seconds (transformers' Qwen2, diffusers' VAE)."""
    import subprocess
    import sys

    tiny_policy("flow").save_pretrained(tmp_path / "p")
    code = (
        "import sys; from margrpo.policy import load_policy; load_policy(sys.argv[1]); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'diffusers'}))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "p")], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_and_corrupt_checkpoints_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_policy(tmp_path)
    policy = tiny_policy("flow")
    policy.save_pretrained(tmp_path / "p")
    (tmp_path / "p" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="model.safetensors"):
        load_policy(tmp_path / "p")


def test_parameter_groups_split_the_model_and_leave_the_text_encoder_out():
    policy = tiny_policy("ddpm")
    ar, head = set(map(id, policy.ar_parameters())), set(map(id, policy.head_parameters()))
    text = set(map(id, policy.text_encoder.parameters()))
    assert not ar & head and not (ar | head) & text and ar | head | text == set(map(id, policy.parameters()))


def test_codec_round_trip():
    policy = tiny_policy("flow")
    images = torch.rand(3, 3, 64, 64)
    assert torch.allclose(policy.decode(policy.encode(images)), images, atol=1e-6)


@pytest.mark.parametrize("head", ["flow", "ddpm"])
def test_x0_head_gives_the_sampler_its_clean_estimate(head):
    """head_prediction="x0": the sampler's pred_x0 is exactly the MLP's clean-token output."""
    policy = tiny_policy(head)
    sampler = policy.make_sampler(10)
    x_t, z = torch.randn(6, policy.token_dim), torch.randn(6, policy.z_dim)
    for i in (1, 4, 8):  # not step 0: there abar(999) ~ 1e-9 and eps -> x0 amplifies float32 rounding 3e4 times
        t = sampler.model_time(i).expand(6)
        x0 = policy.diffloss(x_t, t, z)[:, : policy.token_dim]
        step = sampler.step(policy.head(x_t, t, z), i, x_t)
        assert torch.allclose(step.pred_x0, x0, atol=1e-4), i


def test_shared_order_gives_each_group_one_generation_order():
    policy = tiny_policy("flow")
    r = generate(
        policy, PROMPTS[:2], SAMPLING, group_size=3, generator=torch.Generator().manual_seed(0), shared_order=True
    )
    assert (r.orders[:3] == r.orders[0]).all() and (r.orders[3:] == r.orders[3]).all()
    assert not (r.orders[0] == r.orders[3]).all()
    assert_ratio_is_one(policy, r)


def test_shared_noise_starts_each_group_from_one_noise_draw():
    policy = tiny_policy("flow")
    r = generate(
        policy,
        PROMPTS[:2],
        SAMPLING,
        group_size=3,
        generator=torch.Generator().manual_seed(0),
        shared_order=True,
        shared_noise=True,
    )
    start = r.states[:, 0]  # [K, N, L, D]: each step's initial noise (zeros at tokens already known)
    unknown = ~r.known  # [K, N, L]
    for k in range(start.shape[0]):
        for n in (1, 2, 4, 5):
            first = n - n % 3
            assert torch.equal(start[k, n][unknown[k, n]], start[k, first][unknown[k, first]])
    assert not torch.equal(start[0, 0], start[0, 3])  # another prompt: another draw
    assert not torch.equal(r.latents[0], r.latents[1])  # the scored SDE noise still differs
    assert_ratio_is_one(policy, r)
    indep = generate(
        policy, PROMPTS[:2], SAMPLING, group_size=3, generator=torch.Generator().manual_seed(0), shared_order=True
    )
    assert not torch.equal(indep.states[0, 0, 0], indep.states[0, 0, 1])


@pytest.mark.parametrize("head", ["flow", "ddpm"])
def test_final_step_noise_gives_the_last_step_a_log_prob_that_replays(head, monkeypatch):
    policy = tiny_policy(head)
    sampling = SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=2.0, final_step_noise=True)
    r = generate(
        policy,
        PROMPTS[:2],
        sampling,
        group_size=2,
        generator=torch.Generator().manual_seed(0),
        trajectories=2,
        mte_generator=torch.Generator().manual_seed(1),
    )
    assert (r.log_probs[:, -1] != 0).any()  # the last step is scored
    rp = assert_ratio_is_one(policy, r)
    assert rp.mask[:, -1].any()
    monkeypatch.setattr(policy, "make_sampler", lambda *args: types.SimpleNamespace(config=None))
    with pytest.raises(ValueError, match="final_step_noise: SimpleNamespace has no stochastic final step"):
        generate(policy, PROMPTS[:1], sampling)


def test_stage_sampling_config_keeps_every_field():
    """The stages build SamplingConfig from the config section: no field may be dropped on the way."""
    import dataclasses

    from margrpo.stages._common import sampling_config

    section = {f.name: f.default for f in dataclasses.fields(SamplingConfig)} | {
        "final_step_noise": True,
        "ar_steps": 3,
    }
    assert dataclasses.asdict(sampling_config(section)) == section


@pytest.mark.parametrize("head", ["flow", "ddpm"])
@pytest.mark.parametrize("shared", [False, True])
def test_recording_some_steps_in_full_changes_no_sample_and_no_recorded_value(head, shared):
    """`full_steps`: the other AR steps denoise their committed tokens alone, from the same noise draws (the
    products are batch-invariant), so the images and every value the smaller record holds are the same bits."""
    policy = tiny_policy(head)
    kw = dict(trajectories=3, mte_steps=torch.tensor([2]), shared_order=shared, shared_noise=shared)
    every, some = rollout(policy, **kw), rollout(policy, full_steps=[0], **kw)
    assert some.full.tolist() == [True, False, True, False]  # the asked step and MTE's
    assert torch.equal(every.images, some.images) and torch.equal(every.latents, some.latents)
    for a, b in ((every.states, some.states), (every.log_probs, some.log_probs)):
        assert torch.equal(a[some.full], b[some.full])
        c = every.committed[:, None, ..., None] if a.dim() == 5 else every.committed[:, None]
        assert torch.equal(a * c, b * c)  # the committed tokens' trajectories at every step
    assert torch.equal(every.mte_states, some.mte_states)
    not_full = (
        (~some.full)[:, None, None] & ~some.known & ~some.committed
    )  # [K, N, L] unknown, not committed, step not full
    assert not_full.any() and bool((some.log_probs.transpose(0, 1)[:, not_full] == 0).all())
    assert bool((every.log_probs.transpose(0, 1)[:-1, not_full] != 0).all())  # which the full record holds
    assert_ratio_is_one(policy, some)  # at the steps recorded in full


def test_replaying_a_step_not_recorded_in_full_fails_clearly():
    policy = tiny_policy("flow")
    r = rollout(policy, full_steps=[1])
    diff = torch.arange(3)[None]
    replay(policy, r, torch.tensor([1]), diff)  # recorded in full: fine
    for fn in (replay, lambda p, r, a, d: recorded(r, a, d)):
        with pytest.raises(ValueError, match=r"AR steps \[3\].*full_steps"):
            fn(policy, r, torch.tensor([1, 3]), diff.repeat(2, 1))
    with pytest.raises(ValueError, match="full_steps"):
        rollout(policy, full_steps=[4])
