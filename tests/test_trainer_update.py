"""design.md §3.3-3.10 at the level of one update: the loss a micro-batch backpropagates against design.md §3's
formula, its exact reductions, the gradient's independence of the micro-batch and replay-chunk splits, the gradient
statistics (the norm, the variance probe) and the non-finite guards. The variants and
the loop: test_trainer_variants.py."""

import math

import pytest
import torch
from helpers import PROMPT_SET, PROMPTS, SAMPLING, make_trainer, tiny_policy

from margrpo.grpo.grad_stats import GradVarianceProbe, NoProbe, grad_square_norm
from margrpo.grpo.replay import recorded, replay
from margrpo.grpo.rollout import generate
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
from margrpo.grpo.variants import LossInputs, OldLogProbs, TokenCounts


def test_positive_advantage_raises_that_samples_log_prob(tmp_path):
    """One update with sample 0 favoured (A > 0) must raise its recorded trajectory's log-prob."""
    policy = tiny_policy("flow")
    r = generate(policy, PROMPTS[:1], SAMPLING, group_size=2, generator=torch.Generator().manual_seed(0))
    ar, diff = torch.arange(4), torch.arange(4)[None].repeat(4, 1)
    trainer = make_trainer(tmp_path, policy=policy, beta=0.0, lr=1e-5)  # small enough for the first-order effect
    adv = torch.tensor([1.0, -1.0])
    trainer.optimizer.zero_grad()
    loss, _ = trainer.micro_loss(LossInputs(r, adv, ar, diff))
    loss.backward()
    trainer.optimizer.step()
    after = replay(policy, r, ar, diff)
    old, _ = recorded(r, ar, diff)
    gain = ((after.log_prob - old) * after.mask).sum((0, 1, 3))  # [N]
    assert gain[0] > 0 and gain[1] < 0


def test_reductions_give_the_plain_loss(tmp_path):
    """S = 1, k = 0 and tau = -inf reduce the MTE / Sim loss to the plain GRPO loss exactly."""
    policy = tiny_policy("flow")
    r = generate(
        policy,
        PROMPTS[:2],
        SAMPLING,
        group_size=2,
        generator=torch.Generator().manual_seed(3),
        trajectories=3,
        mte_generator=torch.Generator().manual_seed(4),
    )
    ar, diff = torch.tensor([0, 2, 3]), torch.tensor([[0, 1], [1, 3], [2, 3]])
    adv = torch.tensor([0.5, -0.5, 1.0, -1.0])
    plain = make_trainer(tmp_path / "a", policy=policy, beta=0.0)
    base, _ = plain.micro_loss(LossInputs(r, adv, ar, diff))
    k0 = make_trainer(tmp_path / "b", policy=policy, beta=0.0, trajectories=3, top_frac=0.0)
    mte_mask, _ = k0.masks(r)
    assert not mte_mask.any()
    loss_k0, _ = k0.micro_loss(LossInputs(r, adv, ar, diff, mte_mask))
    sim = make_trainer(tmp_path / "c", policy=policy, beta=0.0, sim=True, tau=-math.inf)
    _, keep = sim.masks(r)
    assert keep.all()
    loss_tau, _ = sim.micro_loss(LossInputs(r, adv, ar, diff, sim_keep=keep))
    assert torch.equal(base, loss_k0) and torch.equal(base, loss_tau)


def test_non_finite_rewards_are_rejected(tmp_path):
    def broken(images, prompts, metadata):
        r = torch.zeros(len(images))
        r[1] = float("nan")
        return r, {"broken": r}

    trainer = GRPOTrainer(
        tiny_policy("flow"),
        broken,
        PROMPT_SET,
        PROMPT_SET,
        SAMPLING,
        GRPOConfig(steps=1, batch_prompts=1, group_size=2, mask_steps=2, diffusion_steps=2, precision="no"),
        tmp_path,
    )
    with pytest.raises(ValueError, match="non-finite"):
        trainer.train_step()


def test_non_finite_loss_skips_the_update_then_stops(tmp_path):
    trainer = make_trainer(tmp_path, max_nonfinite=2, steps=3)
    real = trainer.micro_loss

    def nan_loss(*args):
        loss, stats = real(*args)
        return loss * float("nan"), stats

    trainer.micro_loss = nan_loss
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    row = trainer.train_step()
    assert row["skipped"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))
    with pytest.raises(FloatingPointError, match="non-finite"):
        trainer.train_step()


def test_a_non_finite_total_gradient_norm_skips_the_update_where_the_ar_norm_is_finite(tmp_path):
    """The guard reads the total norm that clipping computes (logged as grad_norm): an infinite gradient of the
    head alone (the AR's statistic, grad_norm_ar, stays finite) skips the step instead of writing NaN weights."""
    trainer = make_trainer(tmp_path)
    head = next(p for p in trainer.policy.head_parameters() if p.requires_grad)
    head.register_hook(lambda g: torch.full_like(g, float("inf")))
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    row = trainer.train_step()
    assert math.isfinite(row["grad_norm_ar"]) and not math.isfinite(row["grad_norm"]), row
    assert row["skipped"] == 1
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))


def test_grad_norm_is_the_total_norm_of_the_trained_gradients_before_clipping(tmp_path):
    trainer = make_trainer(tmp_path, grad_clip=0.0)
    seen = {}

    def read_norm(*_):  # the gradients the optimizer applies: unclipped (grad_clip 0)
        seen["norm"] = torch.linalg.vector_norm(
            torch.stack([p.grad.norm() for p in trainer.params if p.grad is not None])
        )

    trainer.optimizer.register_step_pre_hook(read_norm)
    row = trainer.train_step()
    assert row["grad_norm"] == pytest.approx(float(seen["norm"]), rel=1e-5) and row["skipped"] == 0


class OneProcess:
    """What the probe asks of an engine, for `world` processes whose gradients all live here."""

    def __init__(self, world: int = 1):
        self.world = world

    def all_sum(self, x):
        return x

    shard_sum = all_sum


def feed(probe, params, per_micro) -> float:
    """Accumulate each micro-batch's gradients into .grad as backward does, the probe reading after each."""
    for p in params:
        p.grad = None
    probe.start()
    for c, grads in enumerate(per_micro):
        for p, g in zip(params, grads):
            p.grad = g.clone() if p.grad is None else p.grad + g
        probe.after_micro_batch(last=c == len(per_micro) - 1)
    return probe.result(grad_square_norm(params, probe.engine))


def test_gradient_variance_probe_matches_the_explicit_computation():
    """The streaming probe equals stacking each micro-batch's gradient (scaled to the batch mean); the norm too."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5))]
    n = 3
    per_micro = [[torch.randn_like(p) for p in params] for _ in range(n)]  # g_c, as accumulated by backward
    probe = GradVarianceProbe(params, n, OneProcess())
    var = feed(probe, params, per_micro)
    flat = torch.stack([torch.cat([g.flatten() for g in grads]) for grads in per_micro]) * n  # [n, P]
    assert var == pytest.approx(flat.var(dim=0).mean().item(), rel=1e-5)
    assert math.sqrt(grad_square_norm(params, probe.engine)) == pytest.approx(flat.mean(0).norm().item(), rel=1e-6)
    assert feed(probe, params, per_micro) == var  # start() forgets the last update
    with pytest.raises(ValueError, match="grad_variance.*micro_batches"):
        GradVarianceProbe(params, 1, OneProcess())


def test_the_probe_is_off_where_asked_or_impossible_and_owns_its_hook(tmp_path):
    """grpo.grad_variance off (the paper configs): no probe, no grad_var_ar column; the AR gradient's norm is logged
    still. On (the default) with one micro-batch in all: off too, and the log says why. On, the engine makes the
    probe for its reduction: DDP attaches it to the one hook where it reads local gradients, FSDP (whose shards
    `.grad` shows) counts rounds and attaches nothing."""
    assert GRPOConfig().grad_variance is True
    for off in (dict(grad_variance=False), dict(grad_variance=True, micro_batches=1)):
        trainer = make_trainer(tmp_path / str(len(off)) / str(off["grad_variance"]), **off)
        row = trainer.train_step()
        assert isinstance(trainer.probe, NoProbe) and "grad_var_ar" not in row and math.isfinite(row["grad_norm_ar"])

    from margrpo.grpo.build import probe
    from margrpo.grpo.parallel import DDPEngine, FSDPEngine

    params = [torch.nn.Parameter(torch.zeros(2))]
    ddp, fsdp = object.__new__(DDPEngine), object.__new__(FSDPEngine)  # their probe-making, without a process group
    ddp.world, ddp.observers, fsdp.world = 2, [], 2
    on_ddp, on_fsdp = probe(params, GRPOConfig(micro_batches=2), ddp), probe(params, GRPOConfig(micro_batches=2), fsdp)
    assert (on_ddp.rounds, on_ddp.n, on_fsdp.rounds, on_fsdp.n) == (False, 4, True, 2)
    assert ddp.observers == [({id(params[0])}, on_ddp.observe_local)] and not hasattr(fsdp, "observers")


def test_the_probes_rounds_estimator_under_fsdp_is_unbiased():
    """Under FSDP the probe sees each round's sum over the W processes (the reduced shards): W times the variance
    across the n rounds has the expectation of the variance across the n W micro-batches. 4000 draws of
    W = 4 x n = 3 micro-batch gradients with per-element variances 1..4 (mean 2.5): the probe's mean within 2%."""
    torch.manual_seed(1)
    W, n, P = 4, 3, 64
    params = [torch.nn.Parameter(torch.zeros(P))]
    scale = torch.linspace(1, 4, P).sqrt()
    probe = GradVarianceProbe(params, n, OneProcess(world=W), rounds=True)
    values = []
    for _ in range(4000):
        g = torch.randn(W, n, P, dtype=torch.float64) * scale + 0.3  # a common mean: the batch gradient's signal
        values.append(feed(probe, params, [[g[:, c].sum(0).float() / (n * W)] for c in range(n)]))
    # x = n W g, scaled to the batch mean, has the per-element variances 1..4: the quantity estimated is their mean
    assert sum(values) / len(values) == pytest.approx(2.5, rel=0.02)


def test_committed_loss_tokens_average_over_the_tokens_each_step_commits(tmp_path):
    """loss_tokens="committed": per chosen AR step, the surrogate's mean over the tokens committed there only
    (compared through the gradients: at ratio 1 every token mask gives the loss value mean(A))."""
    from margrpo.grpo import masked_mean, per_token_policy_objective

    policy = tiny_policy("flow", seed=1)
    r = generate(policy, PROMPTS[:2], SAMPLING, group_size=2, generator=torch.Generator().manual_seed(5))
    ar, diff = torch.tensor([0, 1, 3]), torch.tensor([[0, 2], [1, 3], [0, 3]])
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    params = [p for p in policy.ar_parameters()]

    def grads(loss):
        return torch.cat(
            [g.flatten() for g in torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True)]
        )

    trainer = make_trainer(tmp_path, policy=policy, beta=0.0, loss_tokens="committed")
    got = grads(trainer.micro_loss(LossInputs(r, adv, ar, diff))[0])
    rp = replay(policy, r, ar, diff)
    obj = per_token_policy_objective(rp.log_prob, rp.log_prob.detach(), adv, 0.2)
    tokens = rp.mask & r.committed[ar][:, None]  # [M, U, N, L]
    expected = grads(torch.stack([-masked_mean(obj[m], tokens[m].float()) for m in range(len(ar))]).mean())
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-7) and expected.abs().max() > 0
    completion = grads(
        make_trainer(tmp_path / "c", policy=policy, beta=0.0).micro_loss(LossInputs(r, adv, ar, diff))[0]
    )
    assert not torch.allclose(got, completion, rtol=1e-3)  # the completion mask also holds tokens committed later


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"freeze_head": True},
        {"freeze_head": True, "trajectories": 3},
        {"freeze_head": True, "trajectories": 3, "sim": True},
        {"sim": True, "loss_tokens": "committed"},
        {"kl": "gaussian"},
    ],
    ids=["grpo", "fix", "mte", "sim", "sim-committed", "kl-gaussian"],
)
def test_gradient_does_not_depend_on_the_micro_batch_split(tmp_path, variant):
    """design.md §3.7: the loss is normalised by the whole batch's weighted token count, so 1, 2 or 3
    micro-batches give the same gradient (Sim's per-token weights included)."""
    grads = []
    for n in (1, 2, 3):
        trainer = make_trainer(
            tmp_path / str(n),
            policy=tiny_policy("flow", seed=4),
            batch_prompts=3,
            group_size=2,
            micro_batches=n,
            grad_clip=0.0,
            **variant,
        )  # grads of the first step: before any update
        trainer.train_step()
        grads.append(torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None]))
    assert grads[0].norm() > 0
    for g in grads[
        1:
    ]:  # float32: re-batching the same sums differs by ~1e-6 relative; a per-micro-batch mean by ~1e-2
        assert ((g - grads[0]).norm() / grads[0].norm()).item() < 5e-6


def test_reinforce_is_the_official_update_one_step_summing_the_chosen_steps(tmp_path):
    """Issue 27.9: no clip; backward once per chosen AR step (each loss a mean over its chosen diffusion steps
    and tokens), so the |M| gradients are summed; one optimizer step per rollout."""
    trainer = make_trainer(tmp_path, reinforce=True, micro_batches=1, grad_clip=0.0, grad_variance=False)
    assert trainer.cfg.clip_eps is None
    steps = []
    trainer.optimizer.register_step_post_hook(lambda *_: steps.append(trainer.step))
    batch = trainer.rollout_and_score()
    assert len(trainer.plan_updates(batch)) == 1
    grads = []
    for ar, diff in [(batch.ar_steps, batch.diffusion_steps)] + [
        (batch.ar_steps[i : i + 1], batch.diffusion_steps[i : i + 1]) for i in range(len(batch.ar_steps))
    ]:
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.micro_loss(LossInputs(batch.rollout, batch.adv, ar, diff))[0].backward()
        grads.append(torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None]))
    assert len(grads) == 4 and grads[0].norm() > 0
    total = sum(grads[1:])  # float32: the batched pass and the single-step ones round differently (~1e-7 relative)
    assert ((grads[0] - total).norm() / total.norm()).item() < 5e-6
    trainer.train_step()
    assert steps == [0]  # one optimizer step for the |M| = 3 chosen steps
    with pytest.raises(ValueError, match="reinforce: true takes one optimizer step per rollout"):
        GRPOConfig(reinforce=True, updates_per_rollout=2)


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"freeze_head": True, "trajectories": 3},
        {"freeze_head": True, "trajectories": 3, "sim": True},
        {"reinforce": True},
        {"kl": "gaussian", "old_logprob": "recorded"},
        {"updates_per_rollout": 2},
    ],
    ids=["grpo", "mte", "sim", "reinforce", "kl-gaussian-recorded", "two-updates"],
)
def test_replay_chunks_give_the_same_gradient_and_stats(tmp_path, variant):
    """grpo.replay_chunk backpropagates the chosen AR steps a few at a time (the paper's batch ran out of an
    H200 when all |M| were replayed at once): the gradient, the loss and the logged stats stay those of one pass."""
    runs = {}
    for chunk in (None, 1, 2):
        trainer = make_trainer(
            tmp_path / str(chunk),
            policy=tiny_policy("flow", seed=4),
            batch_prompts=3,
            group_size=2,
            mask_steps=3,
            beta=0.05,
            grad_clip=0.0,
            replay_chunk=chunk,
            steps=1,
            **variant,
        )
        batch = trainer.rollout_and_score()
        update = trainer.plan_updates(batch)[-1]
        trainer.optimizer.step = lambda *args, **kwargs: None  # the batch gradient stays in .grad
        log = trainer.update(batch, update)
        runs[chunk] = (torch.cat([p.grad.flatten() for p in trainer.params if p.grad is not None]), log)
    grad, log = runs[None]
    assert grad.norm() > 0 and log["skipped"] == 0
    for chunk in (1, 2):
        g, other = runs[chunk]
        assert ((g - grad).norm() / grad.norm()).item() < 5e-6, chunk
        assert other.keys() == log.keys()
        for k in log:  # the loss terms, the ratio stats over every chunk's tokens, the norms, the probe
            assert other[k] == pytest.approx(log[k], rel=1e-5, abs=1e-6, nan_ok=True), (chunk, k)


@pytest.mark.parametrize("variant", ["fix", "mte", "sim"])
def test_the_loss_a_micro_batch_backpropagates_is_design_3s_formula(tmp_path, variant):
    """`micro_loss`, the loss `update` backpropagates, against design.md §3 written out here in float64: the
    ratio to log_prob_old, the clip, Eq. 10's trajectory mean over M^k (+MTE), Sim's kappa weights (+Sim), the
    completion mask, the KL of Eq. 14 on the completion mask, both normalised by the whole batch's token counts
    of each chosen step, then averaged over the chosen steps (Eq. 7) with beta on the KL."""
    switches = {"fix": {}, "mte": {"trajectories": 3, "top_frac": 0.5}}
    switches["sim"] = {**switches["mte"], "sim": True, "tau": 0.0}
    trainer = make_trainer(
        tmp_path, freeze_head=True, beta=0.1, micro_batches=2, batch_prompts=2, group_size=2, **switches[variant]
    )
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # away from the reference, so that the KL is not 0
        for p in trainer.policy.ar_parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    batch = trainer.rollout_and_score()
    ar, diff, cfg = batch.ar_steps, batch.diffusion_steps, trainer.cfg
    rows, sub = batch.rows[0], batch.subs[0]
    mte, keep = batch.micro_batch_mask(batch.mte_mask, 0), batch.micro_batch_mask(batch.sim_keep, 0)
    assert (mte is not None) == (variant != "fix") and (keep is not None) == (variant == "sim")

    # the whole batch's counts per chosen step, written out: completion tokens (x kappa for the policy term)
    stochastic = trainer.sampler.is_stochastic(diff.reshape(-1)).view(diff.shape)  # [M, U]
    completion = (~batch.rollout.known[ar])[:, None] & stochastic[:, :, None, None]  # [M, U, N, L]
    kappa = (
        torch.ones_like(completion) if batch.sim_keep is None else batch.sim_keep[ar][:, None].expand_as(completion)
    )
    counts = TokenCounts((completion & kappa.bool()).sum((1, 2, 3)).float(), completion.sum((1, 2, 3)).float())

    with torch.no_grad():  # log_prob_old: this pass's log-probs moved, so that the ratios reach the clip
        rp = replay(
            trainer.policy, sub, ar, diff, logprob_cfg=cfg.logprob_cfg, with_mte=mte is not None, mte_tokens=mte
        )
        ref = replay(trainer.ref, sub, ar, diff, logprob_cfg=cfg.logprob_cfg)
    old = rp.log_prob - 0.4 * torch.randn(rp.log_prob.shape, generator=g)
    old_mte = (
        None if rp.mte_log_prob is None else rp.mte_log_prob - 0.4 * torch.randn(rp.mte_log_prob.shape, generator=g)
    )
    loss, stats = trainer.micro_loss(
        LossInputs(sub, batch.adv[rows], ar, diff, mte, keep, OldLogProbs(old, old_mte), counts)
    )

    def surrogate(lp, lp_old, adv):  # design.md §3.5: min(r A, clip(r, 1 - eps, 1 + eps) A)
        r = torch.exp(lp.double() - lp_old.double())
        return torch.minimum(r * adv, r.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps) * adv)

    adv = batch.adv[rows].double()[:, None]  # [n, 1]: one advantage per image
    sub_completion = (~sub.known[ar])[:, None] & stochastic[:, :, None, None]  # [M, U, n, L]
    policy_terms, kl_terms = [], []
    for m, k in enumerate(ar.tolist()):
        obj = surrogate(rp.log_prob[m], old[m], adv)  # [U, n, L]
        if mte is not None and mte[k].any():  # Eq. 10: M^k * mean over the S trajectories + (1 - M^k) * l^(1)
            extra = surrogate(rp.mte_log_prob[m], old_mte[m], adv)  # [S - 1, U, n, L]
            obj = torch.where(mte[k], (obj + extra.sum(0)) / cfg.trajectories, obj)
        weight = sub_completion[m].double() * (1.0 if keep is None else keep[k].double())
        policy_terms.append(-(obj * weight).sum() / counts.policy[m].double())
        d = ref.mean[m].double() - rp.mean[m].double()  # Eq. 14: sum over channels of exp(d) - d - 1
        kl = (torch.exp(d) - d - 1).sum(-1)  # [U, n, L]
        kl_terms.append((kl * sub_completion[m]).sum() / counts.kl[m].double())
    expected = torch.stack(policy_terms).mean() + cfg.beta * torch.stack(kl_terms).mean()
    assert loss.item() == pytest.approx(float(expected), rel=1e-5, abs=1e-9), variant
    assert stats["kl"] == pytest.approx(float(torch.stack(kl_terms).mean()), rel=1e-4) and stats["kl"] > 0
    assert 0 < stats["clip_frac"] < 1, stats  # the clip is exercised on both sides of it
    if variant != "fix":
        assert any(mte[k].any() for k in ar.tolist()), "no M^k: Eq. 10 is not exercised"
    if variant == "sim":
        assert not keep[ar].all(), "kappa drops no token: the weights are not exercised"
