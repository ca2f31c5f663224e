"""MARVAL on the toy: the one-step sampler, the distillation, GRPO on the one-step policy, MARVAL-RL."""

import math

import pytest
import torch
from helpers import PROMPTS, VOCAB, assert_ratio_is_one, tiny_policy

from margrpo.diffusion import OneStepSampler
from margrpo.grpo.rollout import SamplingConfig, generate
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
from margrpo.policy import load_policy
from margrpo.prompts.suites import PromptSet
from margrpo.related.marval import (
    MARVALRL,
    MARVALConfig,
    MARVALDistiller,
    MARVALRLConfig,
    committed_log_prob,
    generate_one_step,
    one_step_policy,
    teacher_distance,
)
from margrpo.related.marval.distill import draw_rows

TEACHER_SAMPLING = SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=2.0)
ONE_STEP = SamplingConfig(ar_steps=4, diffusion_steps=2, cfg_scale=1.0)  # |T| = 1: one generation step + a hold step
SPEC = {
    "objects": [{"color": "red", "shape": "circle", "texture": None, "count": 1}],
    "relation": None,
    "exact_count": False,
}
PROMPT_SET = PromptSet(PROMPTS, [{"spec": SPEC, "category": "color"}] * len(PROMPTS))


def test_one_step_log_prob_is_the_gaussian_density_and_hold_steps_keep_the_sample():
    sampler = OneStepSampler(num_steps=3, std=0.2)
    g = torch.Generator().manual_seed(0)
    mean, eps0 = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    out = sampler.step(mean, 0, eps0, generator=g, temperature=1.5)
    expected = torch.distributions.Normal(mean, 0.2 * 1.5).log_prob(out.prev_sample).sum(-1)
    assert torch.allclose(out.log_prob, expected, atol=1e-4, rtol=1e-6)
    assert not torch.equal(out.prev_sample, mean)  # noise was drawn
    hold = sampler.step(torch.randn(5, 7), 2, out.prev_sample)
    assert hold.log_prob is None and torch.equal(hold.prev_sample, out.prev_sample)
    mixed = sampler.step(mean, torch.tensor([0, 1, 0, 2, 1]), eps0, generator=g)  # per-row steps
    assert (mixed.log_prob[[1, 3, 4]] == 0).all() and (mixed.log_prob[[0, 2]] != 0).all()
    assert torch.equal(mixed.prev_sample[[1, 3, 4]], eps0[[1, 3, 4]])
    assert sampler.is_stochastic(torch.arange(3)).tolist() == [True, False, False]


def _rows(distiller, seed=5):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        rollout = generate_one_step(distiller.student, PROMPTS, TEACHER_SAMPLING, generator=g, with_uncond=True)
    return draw_rows(rollout, 64, g)


@pytest.mark.parametrize("objective", ["sim", "dmd"])
def test_distillation_moves_the_student_toward_the_teachers_samples(objective):
    """The moment distance of the student's tokens to the teacher's 20-step guided samples, at the same z, drops."""
    distiller = MARVALDistiller(
        tiny_policy("flow"),
        TEACHER_SAMPLING,
        MARVALConfig(
            steps=25,
            batch_prompts=4,
            rows=64,
            objective=objective,
            lr=1e-3,
            fake_lr=1e-3,
            regression_weight=0.0,
            warm_start=0,
        ),
    )  # the variational term alone
    rows = _rows(distiller)
    before = teacher_distance(distiller.teacher_head, distiller.student, rows, draws=16)
    head = [p.detach().clone() for p in distiller.student.diffloss.parameters()]
    ar = [p.detach().clone() for p in distiller.student.ar_parameters()]
    metrics = distiller.train(PROMPT_SET)
    after = teacher_distance(distiller.teacher_head, distiller.student, rows, draws=16)
    assert len(metrics) == 25 and all(
        math.isfinite(r["student_loss"]) and math.isfinite(r["fake_loss"]) for r in metrics
    )
    assert after["distance"] < 0.85 * before["distance"], (before, after)
    assert any(not torch.equal(a, b) for a, b in zip(head, distiller.student.diffloss.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(ar, distiller.student.ar_parameters()))  # the AR model stays frozen
    assert metrics[-1]["fake_loss"] < metrics[0]["fake_loss"]  # the fake score head learns the student's tokens


def test_regression_term_moves_the_student_toward_the_teachers_ode_samples():
    """DMD's regression term: the student's paired distance to the teacher's ODE sample from the same noise drops,
    and by more than with the variational term alone; warm-start iterations have no variational loss."""

    def run(**kw):
        cfg = MARVALConfig(steps=20, batch_prompts=4, rows=64, regression_rows=64, lr=1e-3, fake_lr=1e-3, **kw)
        distiller = MARVALDistiller(tiny_policy("flow"), TEACHER_SAMPLING, cfg)
        rows = _rows(distiller)
        before = teacher_distance(
            distiller.teacher_head, distiller.student, rows, draws=4, steps=TEACHER_SAMPLING.diffusion_steps
        )
        metrics = distiller.train(PROMPT_SET)
        after = teacher_distance(
            distiller.teacher_head, distiller.student, rows, draws=4, steps=TEACHER_SAMPLING.diffusion_steps
        )
        return before, after, metrics

    before, after, metrics = run(regression_weight=1.0, warm_start=10)
    assert after["paired"] < 0.7 * before["paired"], (before, after)
    assert all(math.isnan(r["var_loss"]) for r in metrics[:10]) and all(
        math.isfinite(r["var_loss"]) for r in metrics[10:]
    )
    assert all(math.isfinite(r["reg_loss"]) for r in metrics) and metrics[-1]["reg_loss"] < metrics[0]["reg_loss"]
    _, without, _ = run(regression_weight=0.0, warm_start=0)
    assert after["paired"] < without["paired"], (after, without)
    with pytest.raises(ValueError):
        MARVALConfig(regression_weight=0.0, warm_start=5)  # a warm start needs the regression term


def test_teacher_ode_is_the_flow_samplers_deterministic_chain():
    """teacher_ode matches the Euler ODE of FlowSDESampler(noise_level=0) on the head's guided velocity."""
    from margrpo.diffusion.flow import FlowSDESampler
    from margrpo.related.marval.distill import guided_x0, teacher_ode

    distiller = MARVALDistiller(tiny_policy("flow"), TEACHER_SAMPLING, MARVALConfig(rows=8))
    rows = _rows(distiller)
    head, policy = distiller.teacher_head, distiller.student
    noise = torch.randn(len(rows.cfg), policy.token_dim, generator=torch.Generator().manual_seed(1))
    sampler, x = FlowSDESampler(num_steps=5, noise_level=0.0), noise
    for i in range(5):
        t = torch.full((len(x),), float(sampler.sigmas[i]))
        v = (x - guided_x0(head, x, t, rows)) / t[:, None]
        x = sampler.step(v, i, x, generator=torch.Generator().manual_seed(i)).prev_sample  # no noise is drawn
    assert torch.allclose(teacher_ode(head, rows, noise, 5), x, atol=1e-5)
    assert torch.equal(teacher_ode(head, rows, noise, 5), teacher_ode(head, rows, noise, 5))  # deterministic


def test_grpo_runs_unchanged_on_the_one_step_policy_with_ratio_one(tmp_path):
    policy = one_step_policy(tiny_policy("flow"), std=0.1)
    r = generate(policy, PROMPTS[:2], ONE_STEP, group_size=2, generator=torch.Generator().manual_seed(1))
    assert_ratio_is_one(policy, r)  # the record's one-step log-probs replay exactly
    assert (r.log_probs[:, 1] == 0).all() and torch.equal(r.states[:, 1], r.states[:, 2])  # the hold step
    cfg = GRPOConfig(
        steps=2,
        batch_prompts=2,
        group_size=2,
        mask_steps=2,
        diffusion_steps=1,
        save_every=1,
        val_every=1,
        val_prompts=2,
        precision="no",
        lr=1e-3,
        trackers=(),
    )
    trainer = GRPOTrainer(
        policy, lambda im, p, m: (im[:, 0].mean((1, 2)), {}), PROMPT_SET, PROMPT_SET, ONE_STEP, cfg, tmp_path
    )
    before = [p.detach().clone() for p in policy.head_parameters()]
    rows = trainer.train()
    assert rows[0]["ratio_min"] == 1.0 and rows[0]["ratio_max"] == 1.0
    assert all(math.isfinite(rows[-1][k]) for k in ("policy_loss", "kl_paper", "grad_norm_ar", "reward_mean"))
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.head_parameters()))
    reloaded = load_policy(tmp_path / "state" / "ckpt-000002" / "policy")
    assert isinstance(reloaded.make_sampler(2), OneStepSampler)


def test_distilled_policy_round_trips_through_its_folder(tmp_path):
    distiller = MARVALDistiller(
        tiny_policy("flow"), TEACHER_SAMPLING, MARVALConfig(steps=2, batch_prompts=2, rows=16, save_every=1, std=0.07)
    )
    distiller.train(PROMPT_SET, tmp_path)
    loaded = load_policy(tmp_path / "policy")
    assert loaded.config.head_sampler == "one_step" and loaded.config.one_step_std == 0.07
    assert (tmp_path / "metrics.csv").exists() and (tmp_path / "marval.json").exists()
    state = distiller.student.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in loaded.state_dict().items())
    a, b = (
        generate(p, PROMPTS[:2], ONE_STEP, generator=torch.Generator().manual_seed(3))
        for p in (distiller.student, loaded)
    )
    assert torch.equal(a.images, b.images)


def test_replayed_log_prob_is_the_generations_own():
    """committed_log_prob (REINFORCE's log pi) replays each committed token's one-step Gaussian exactly."""
    policy = one_step_policy(tiny_policy("flow"), std=0.1)
    with torch.no_grad():
        r = generate_one_step(policy, PROMPTS[:2], ONE_STEP, group_size=2, generator=torch.Generator().manual_seed(2))
        lp = committed_log_prob(policy, r)
        mean = torch.stack(
            [
                torch.zeros_like(r.tokens).index_put(
                    ((~r.known[k]).nonzero(as_tuple=True)),
                    policy.head(
                        r.noise[k][~r.known[k]], torch.full((int((~r.known[k]).sum()),), 1000.0), r.z_c[k][~r.known[k]]
                    ).float(),
                )
                for k in range(len(r.known))
            ]
        )
    direct = torch.distributions.Normal(mean, 0.1).log_prob(r.samples).sum(-1)  # [K, N, L]
    assert torch.allclose(lp, (direct * r.committed).sum((0, 2)), rtol=1e-5)
    assert torch.allclose(r.tokens, (r.samples * r.committed[..., None]).sum(0))  # each token committed once


def _toyclip():
    from margrpo.rewards.toyclip import ToyClip, ToyClipConfig

    torch.manual_seed(0)
    return ToyClip(ToyClipConfig(vocab=VOCAB, width=16, embed_dim=16, text_width=16, text_depth=1, text_heads=2))


@pytest.mark.parametrize("setting", [{}, {"shapes_grad": "none", "trained": "head"}, {"reg_weight": 0.5}])
def test_marval_rl_steps_give_finite_metrics_and_move_the_policy(setting):
    from margrpo.world.reward import ShapesReward

    teacher = tiny_policy("flow")
    distiller = MARVALDistiller(teacher, TEACHER_SAMPLING, MARVALConfig(rows=32))
    policy = distiller.student
    cfg = MARVALRLConfig(steps=2, batch_prompts=2, group_size=2, lr=1e-3, val_every=1, val_prompts=2, **setting)
    rl = MARVALRL(policy, _toyclip(), ShapesReward(), PROMPT_SET, PROMPT_SET, ONE_STEP, cfg, distiller=distiller)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    rows = rl.train()
    assert len(rows) == 2
    for key in (
        "step",
        "reward_mean",
        "reward_std",
        "reward/toyclip",
        "reward/shapes",
        "val_reward",
        "step_time_s",
        "grad_norm",
        "loss",
    ):
        assert math.isfinite(rows[-1][key]), key
    assert ("reinforce_loss" in rows[0]) == (cfg.shapes_grad == "reinforce")
    assert ("reg_loss" in rows[0]) == bool(cfg.reg_weight)
    moved = {n for n, p in policy.named_parameters() if not torch.equal(before[n], p)}
    assert any(n.startswith("diffloss.") for n in moved)
    assert any(n.startswith("token_proj.") for n in moved) == (cfg.trained == "all")  # only committed tokens feed it
    assert not any(n.startswith("text_encoder.") for n in moved)


def test_reward_gradient_flows_through_the_fed_back_tokens():
    """The AR loop is differentiable: the reward's gradient reaches token_proj, which sees only committed tokens."""
    policy = one_step_policy(tiny_policy("flow"))
    r = generate_one_step(policy, PROMPTS[:2], ONE_STEP, generator=torch.Generator().manual_seed(0))
    r.images.mean().backward()
    assert policy.token_proj.weight.grad is not None and policy.token_proj.weight.grad.abs().sum() > 0
    assert policy.diffloss.out.weight.grad.abs().sum() > 0


def test_marval_rl_with_its_regulariser_resumes_to_the_uninterrupted_run(tmp_path):
    """The regulariser's fake score head, its optimizer and its generator are the method's training state beside
    the policy's (grpo.checkpoints.Part): a run stopped after 2 steps and resumed to 3 draws and updates as the run
    that went straight to 3."""
    from dataclasses import asdict

    from margrpo.grpo.checkpoints import flat_record
    from margrpo.world.reward import ShapesReward

    def run(steps: int, state_dir=None) -> MARVALRL:
        distiller = MARVALDistiller(tiny_policy("flow"), TEACHER_SAMPLING, MARVALConfig(rows=32))
        cfg = MARVALRLConfig(
            steps=steps, batch_prompts=2, group_size=2, lr=1e-3, val_every=1, val_prompts=2, reg_weight=0.5
        )
        rl = MARVALRL(distiller.student, _toyclip(), ShapesReward(), PROMPT_SET, PROMPT_SET, ONE_STEP, cfg, distiller)
        if state_dir is not None:
            rl.keep_state(state_dir, flat_record({"related": asdict(cfg)}), "")
        rl.train()
        return rl

    run(2, tmp_path / "state")
    resumed, full = run(3, tmp_path / "state"), run(3)
    assert resumed.step == full.step == 3

    def numbers(rows):
        return [{k: v for k, v in r.items() if k != "step_time_s"} for r in rows]

    assert numbers(resumed.rows) == numbers(full.rows)
    for (name, a), b in zip(resumed.policy.state_dict().items(), full.policy.state_dict().values()):
        assert torch.equal(a, b), name
    assert torch.equal(resumed.distiller.generator.get_state(), full.distiller.generator.get_state())
