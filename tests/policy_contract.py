"""The policy contract: the checks every MAR policy must pass (docs/design.md §2.3, §3.2), as a test class a policy
opts into with one line in its own test file:

    class TestToyFlowContract(PolicyContract):
        build = staticmethod(partial(tiny_policy, "flow", dropout=0.2))

`build` returns a tiny random-weight policy (the real class on a tiny config); pytest collects the inherited test_
methods, one per check, so a failure names the check. `load` loads a saved folder (default: `load_policy`, the
workflow's entry point, which must recognise the policy's folder). docs/adding-a-policy.md describes the interface.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from helpers import PROMPTS, assert_ratio_is_one, make_trainer
from torch.distributions import Independent, Normal

from margrpo.grpo.replay import replay
from margrpo.grpo.rollout import Rollout, SamplingConfig, ar_schedule, generate, stochastic_steps
from margrpo.policy import MARPolicy, TextCondition, load_policy

SAMPLING = SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=3.0, cfg_schedule="linear", temperature=0.9)
TRAJECTORIES = 2  # S of the recorded rollout: MTE's extra trajectory is part of every record check


def rollout(policy: MARPolicy, seed: int = 0, trajectories: int = TRAJECTORIES) -> Rollout:
    """Two prompts, two images each (N = 4), from seeded generators."""
    return generate(
        policy,
        PROMPTS[:2],
        SAMPLING,
        group_size=2,
        generator=torch.Generator().manual_seed(seed),
        trajectories=trajectories,
        mte_generator=torch.Generator().manual_seed(seed + 99),
    )


def every_step(r: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
    """Every AR step [K] and every stochastic diffusion step of each [K, T']."""
    K = r.known.shape[0]
    return torch.arange(K), torch.arange(stochastic_steps(r.sampling))[None].repeat(K, 1)


def loss_under(trainer, batch, **variant) -> torch.Tensor:
    """The trainer's loss of `batch` (one micro-batch) with its config's variant switches set to `variant`: the
    trainer's own masks, update plan and micro-batch loss, no optimizer step."""
    base = trainer.cfg
    trainer.cfg = replace(base, **variant)
    try:
        mte_mask, sim_keep = trainer.masks(batch.rollout)
        batch = replace(batch, mte_mask=mte_mask, sim_keep=sim_keep)
        (update,) = trainer.plan_updates(batch)
        (part,) = trainer.backwards(batch, update)
        with torch.no_grad():
            loss, _ = trainer.micro_loss(part.inputs)
    finally:
        trainer.cfg = base
    return loss


def ar_and_head(policy: MARPolicy) -> tuple[torch.Tensor, torch.Tensor]:
    """z of two prompts' images, half their tokens known, and the head's output on a few of them."""
    L, D = policy.seq_len, policy.token_dim
    known = torch.zeros(2, L, dtype=torch.bool)
    known[:, : L // 2] = True
    with torch.no_grad():
        cond = policy.prepare_condition(policy.encode_prompts(PROMPTS[:2]))
        z = policy.ar_forward(torch.randn(2, L, D), known, cond)
        t = policy.make_sampler(5).model_time(1).expand(3)
        return z, policy.head(torch.randn(3, D), t, z[0, :3])


PLAIN = dict(trajectories=1, sim=False)  # GRPO: no MTE, no Sim


def assert_reduces(trainer, batch, reduced: dict, live: dict) -> None:
    """The `reduced` variant's loss is GRPO's, bit for bit; `live` (changes to `reduced`) is not: the switch acts."""
    plain = loss_under(trainer, batch, **PLAIN)
    assert torch.equal(loss_under(trainer, batch, **reduced), plain)
    assert not torch.equal(loss_under(trainer, batch, **{**reduced, **live}), plain)


class PolicyContract:
    """Every check a MAR policy must pass. Subclass it as `Test<Policy>Contract` and set `build`."""

    build: Callable[[], MARPolicy]
    load: Callable[..., MARPolicy] = staticmethod(load_policy)

    @pytest.fixture(scope="class")
    def policy(self) -> MARPolicy:
        return self.build()

    @pytest.fixture(scope="class")
    def record(self, policy) -> Rollout:
        return rollout(policy)

    @pytest.fixture(scope="class")
    def step(self, tmp_path_factory):
        """A trainer on a fresh policy (it chooses what trains) and one scored batch, recorded for every variant
        below: S = 3 trajectories, each chosen step's predecessor in full (Sim's kappa). log_prob_old is the
        record's, shifted as an optimizer step would move it: at ratio 1 every trajectory's objective is its
        advantage and MTE's mean over them could not differ from GRPO's."""
        trainer = make_trainer(
            tmp_path_factory.mktemp("contract"),
            self.build(),
            micro_batches=1,
            trackers=[],
            trajectories=3,
            top_frac=0.0,
            sim=True,
            tau=-math.inf,
            old_logprob="recorded",
        )
        batch = trainer.rollout_and_score()
        for r in (batch.rollout, *batch.subs):
            for log_probs in (r.log_probs, r.mte_log_probs):
                log_probs.add_(0.1 * torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(0)))
        return trainer, batch

    # --- the interface ----------------------------------------------------------------------------------------
    def test_interface_shapes(self, policy):
        """z [B, L, z_dim]; head output [n, D * out_channels_factor]; the codec between images in [0, 1] and tokens
        [B, L, D]; a token grid of L tokens."""
        L, D = policy.seq_len, policy.token_dim
        rows, cols = policy.token_grid
        assert rows * cols == L and policy.head_type in ("flow", "ddpm") and policy.mask_rounding in ("floor", "round")
        z, out = ar_and_head(policy)
        assert z.shape == (2, L, policy.z_dim) and out.shape == (3, D * policy.make_sampler(5).out_channels_factor)
        with torch.no_grad():
            images = policy.decode(torch.randn(2, L, D))
            tokens = policy.encode(images)
            assert len(policy.null_condition(2)) == 2
        assert images.shape[:2] == (2, 3) and 0 <= images.min() and images.max() <= 1
        assert tokens.shape == (2, L, D)

    def test_parameter_groups_are_disjoint_and_nonempty(self, policy):
        """+Fix freezes `head_parameters`; RL trains `ar_parameters`: neither empty, no parameter in both."""
        ar, head = set(map(id, policy.ar_parameters())), set(map(id, policy.head_parameters()))
        assert ar and head and not ar & head

    def test_ar_forward_gives_each_row_its_own_z(self, policy):
        """The replay batches rows of different AR steps (known counts) and both CFG branches (text lengths) in one
        pass: each row's z is the z of that row alone."""
        L, D = policy.seq_len, policy.token_dim
        known = torch.zeros(3, L, dtype=torch.bool)
        known[1, ::3] = True
        known[2, : L - 2] = True  # row 0 knows nothing: the first AR step
        tokens = torch.where(known[..., None], torch.randn(3, L, D), 0.0)
        was_training = policy.training
        policy.eval()
        try:
            with torch.no_grad():
                prompts = policy.prepare_condition(policy.encode_prompts(PROMPTS[:2]))
                cond = TextCondition.cat([prompts, policy.prepare_condition(policy.null_condition(1))])
                batched = policy.ar_forward(tokens, known, cond)
                alone = [
                    policy.ar_forward(tokens[i : i + 1], known[i : i + 1], cond.index(slice(i, i + 1)))
                    for i in range(3)
                ]
        finally:
            policy.train(was_training)
        torch.testing.assert_close(batched, torch.cat(alone), atol=1e-5, rtol=1e-5)

    # --- design.md §3.1: the log-prob of a sampler step --------------------------------------------------------
    def test_log_prob_is_the_gaussian_of_the_sampler_step(self, policy, record):
        """Each recorded transition x_t -> x_{t-1}, scored through the policy's own head: the sampler's log-prob is
        torch.distributions' diagonal Gaussian of the step's mean and std, summed over the D channels."""
        ar, diff = every_step(record)
        with torch.no_grad():
            rp = replay(policy, record, ar, diff)
        x_prev = record.states[ar[:, None], diff + 1]  # [K, T', N, L, D]
        gaussian = Independent(Normal(rp.mean, rp.std.expand_as(rp.mean)), 1).log_prob(x_prev)  # [K, T', N, L]
        assert rp.mask.any()
        torch.testing.assert_close(rp.log_prob[rp.mask], gaussian[rp.mask], atol=1e-4, rtol=1e-5)

    # --- design.md §3.2: the rollout record and the ratio invariant -------------------------------------------
    def test_ratio_is_one_on_unchanged_parameters(self, policy, record):
        """Replaying every recorded step (committed and MTE trajectories) with exact CFG (both branches, as the
        rollout guided) reproduces the recorded log-probs: |ratio - 1| < 1e-5 in float32, with the policy in train
        mode (dropout must not leak), which the replay leaves it in."""
        policy.train()
        assert_ratio_is_one(policy, record, atol=1e-5)
        assert policy.training

    def test_rollout_record_shapes(self, policy, record):
        """Rollout's fields against N images, K AR steps (the policy's schedule), T diffusion steps, L tokens of D
        channels, S trajectories at M' MTE steps."""
        r, N, T, S = record, 4, SAMPLING.diffusion_steps, TRAJECTORIES
        K, L, D = len(ar_schedule(policy, SAMPLING)), policy.seq_len, policy.token_dim
        assert len(r.prompts) == N and r.latents.shape == (N, L, D) and r.orders.shape == (N, L)
        assert r.images.shape[:2] == (N, 3) and r.images.shape == policy.decode(r.latents).shape
        assert r.known.shape == r.committed.shape == (K, N, L) and r.known.dtype == r.committed.dtype == torch.bool
        assert r.states.shape == (K, T + 1, N, L, D) and r.log_probs.shape == (K, T, N, L)
        assert r.states.dtype == r.log_probs.dtype == torch.float32 and r.cfg.shape == (K,)
        M = len(r.mte_steps)
        assert r.trajectories == S and r.mte_states.shape == (M, S - 1, T + 1, N, L, D)
        assert r.mte_log_probs.shape == (M, S - 1, T, N, L)

    def test_rollout_record_commits_every_token_once(self, policy, record):
        """Each token is committed at one AR step, by the policy's schedule, as that step's final state; known
        tokens are not generated again; each image has its own order."""
        r = record
        K, N, L = r.committed.shape
        assert torch.equal(r.committed.sum(0), torch.ones(N, L, dtype=torch.long))
        for k in range(K):
            assert torch.equal(r.known[k], r.committed[:k].any(0)) if k else not r.known[0].any()
            c = r.committed[k]
            assert torch.equal(r.states[k, -1][c], r.latents[c])
            assert (r.states[k][:, r.known[k]] == 0).all()
        left = ar_schedule(policy, SAMPLING)
        assert (r.committed.sum((1, 2)) // N).tolist() == [a - b for a, b in zip([L] + left[:-1], left)]
        assert not torch.equal(r.orders[0], r.orders[1])

    # --- design.md §3.9, §3.10: the variants reduce to GRPO ------------------------------------------------------
    def test_mte_with_one_trajectory_gives_the_plain_loss(self, step):
        """S = 1 turns MTE off at any k; S = 3 at k = 1 moves the loss."""
        assert_reduces(*step, dict(trajectories=1, top_frac=1.0, sim=False), dict(trajectories=3, top_frac=1.0))

    def test_mte_with_top_frac_zero_gives_the_plain_loss(self, step):
        """k = 0: no token averages over the S trajectories; k = 1 moves the loss."""
        assert_reduces(*step, dict(trajectories=3, top_frac=0.0, sim=False), dict(top_frac=1.0))

    def test_sim_with_tau_minus_inf_gives_the_plain_loss(self, step):
        """tau = -inf: kappa keeps every token; tau = 0 moves the loss."""
        assert_reduces(*step, dict(trajectories=1, sim=True, tau=-math.inf), dict(tau=0.0))

    # --- persistence -----------------------------------------------------------------------------------------
    def test_save_load_round_trip(self, policy, tmp_path):
        """`save_pretrained`, then `load`: the same class, identical parameters, identical samples and log-probs."""
        policy.save_pretrained(tmp_path / "policy")
        loaded = self.load(tmp_path / "policy")
        assert isinstance(loaded, type(policy))
        mine, theirs = policy.state_dict(), loaded.state_dict()
        assert mine.keys() == theirs.keys()
        assert not [k for k in mine if not torch.equal(mine[k], theirs[k])]
        a, b = rollout(policy), rollout(loaded)
        assert torch.equal(a.log_probs, b.log_probs) and torch.equal(a.images, b.images)

    # --- margrpo plan: the policy on fake tensors -------------------------------------------------------------
    def test_builds_on_fake_tensors_for_the_memory_plan(self):
        """The plan builds and steps the policy under FakeTensorMode, the data-dependent results replayed from a
        tape recorded on a real run (margrpo.plan.tape): here the build and one AR pass and head call."""
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

        from margrpo.plan.tape import Tape, recording

        tape = Tape()
        with tape, recording(cheap=False):
            real = self.build()
            outputs = ar_and_head(real)
        fake_tape = Tape(tape.values)
        with FakeTensorMode(allow_non_fake_inputs=True), fake_tape:
            fake = self.build()
            fake_outputs = ar_and_head(fake)
        assert not fake_tape.queue  # the fake build took the real one's path
        assert all(isinstance(p, FakeTensor) for p in fake.parameters())
        shapes = {n: (p.shape, p.dtype) for n, p in real.named_parameters()}
        assert {n: (p.shape, p.dtype) for n, p in fake.named_parameters()} == shapes
        assert [t.shape for t in fake_outputs] == [t.shape for t in outputs]
