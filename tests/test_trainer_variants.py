"""design.md §3.3-3.10 at the level of the trainer: one loop, every variant (what each trains, freezes, samples and
logs), the settings' checks, resume. The update's loss and gradient: test_trainer_update.py."""

import math
from pathlib import Path

import pytest
import torch
from helpers import PROMPTS, KillAt, make_trainer, tiny_policy

from margrpo.grpo.replay import completion_mask, recorded
from margrpo.grpo.rollout import SamplingConfig, generate
from margrpo.grpo.trainer import GRPOConfig
from margrpo.grpo.variants import loss_weights
from margrpo.policy.settings import PolicySettings


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"freeze_head": True},
        {"freeze_head": True, "trajectories": 3},
        {"freeze_head": True, "trajectories": 3, "sim": True},
        {"reinforce": True},
        {"kl": "gaussian"},
        {"logprob_cfg": "cond_only"},
        {"reinforce": True, "trajectories": 2},
        {"updates_per_rollout": 2},
    ],
)
def test_every_variant_trains_and_logs(tmp_path, variant):
    trainer = make_trainer(tmp_path, **variant)
    rows = trainer.train()
    trainer.write_outputs({"variant": {"name": "x"}})
    assert len(rows) == 2 and (tmp_path / "metrics.csv").exists() and (tmp_path / "summary.json").exists()
    kl = "kl" if variant.get("kl") == "gaussian" else "kl_paper"  # the KL term, named for what it is
    for key in ("reward_mean", "policy_loss", kl, "grad_norm_ar", "clip_frac", "frac_zero_std", "peak_mem_mb"):
        assert math.isfinite(rows[-1][key]), key
    assert ("kl_paper" if kl == "kl" else "kl") not in rows[-1]  # one name only
    assert math.isfinite(rows[-1]["grad_var_ar"])  # two micro-batches: a variance across them


def test_fix_head_gets_no_gradient_and_no_optimizer_state(tmp_path):
    trainer = make_trainer(tmp_path, freeze_head=True, steps=1)
    head = list(trainer.policy.head_parameters())
    before = [p.detach().clone() for p in head]
    trainer.train()
    assert all(p.grad is None and not p.requires_grad for p in head)
    state_ids = set(trainer.optimizer.state)
    assert not state_ids & set(head)
    assert all(torch.equal(a, b) for a, b in zip(before, head))
    assert any(p in trainer.optimizer.state for p in trainer.policy.ar_parameters())


def test_head_variant_leaves_every_ar_parameter_unchanged_without_optimizer_state(tmp_path):
    """Claim f's `head` variant (freeze_ar): RL on the diffusion head alone."""
    trainer = make_trainer(tmp_path, freeze_ar=True, steps=2)
    ar, head = list(trainer.policy.ar_parameters()), list(trainer.policy.head_parameters())
    before_ar, before_head = [p.detach().clone() for p in ar], [p.detach().clone() for p in head]
    rows = trainer.train()
    assert all(p.grad is None and not p.requires_grad for p in ar)
    assert not set(trainer.optimizer.state) & set(ar) and set(trainer.optimizer.state) == set(head)
    assert all(torch.equal(a, b) for a, b in zip(before_ar, ar))
    assert any(not torch.equal(a, b) for a, b in zip(before_head, head))  # the head did train
    assert rows[-1]["grad_norm_ar"] > 0  # the gradient statistics are the head's here
    with pytest.raises(ValueError, match="nothing to train"):
        make_trainer(tmp_path, freeze_ar=True, freeze_head=True)
    with pytest.raises(ValueError, match="lora adapts the AR"):
        make_trainer(tmp_path, freeze_ar=True, lora={"rank": 4})


def test_resume_reaches_the_same_result(tmp_path, logged):
    full = make_trainer(tmp_path / "full", policy=tiny_policy("flow", seed=1), steps=3)
    rows_full = full.train()
    # killed as step 3 begins: state/ holds step 2's checkpoint
    part = make_trainer(tmp_path / "part", policy=tiny_policy("flow", seed=1), steps=3, hooks=KillAt(2))
    with pytest.raises(pytest.fail.Exception):
        part.train()
    resumed = make_trainer(tmp_path / "part", policy=tiny_policy("flow", seed=1), steps=3)
    rows = resumed.train()
    assert "resumed from" in logged() and len(rows) == 3
    for key in ("reward_mean", "policy_loss", "grad_norm_ar", "val_reward"):
        assert rows[-1][key] == pytest.approx(rows_full[-1][key], rel=1e-6, abs=1e-9), key
    for a, b in zip(full.policy.state_dict().values(), resumed.policy.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-7)


def test_config_errors_say_how_to_fix(tmp_path):
    with pytest.raises(ValueError, match="mask_steps"):
        make_trainer(tmp_path, mask_steps=9)
    for key in ("kl", "logprob_cfg", "old_logprob", "loss_tokens", "group_order", "group_noise"):
        with pytest.raises(ValueError, match=f"Unknown {key}: 'per_token'; expected one of '"):
            GRPOConfig(**{key: "per_token"})
    with pytest.raises(ValueError, match="ratio != 1 from the first update"):
        GRPOConfig(old_logprob="recorded", logprob_cfg="cond_only")
    GRPOConfig(old_logprob="recorded", logprob_cfg="cond_only", reinforce=True)  # no ratio: allowed


@pytest.mark.parametrize("freeze_head", [False, True])
def test_reference_shares_what_rl_never_changes(tmp_path, freeze_head):
    """The reference is a copy of the trained parts only: frozen encoders (and the +Fix head) are the same tensors."""
    trainer = make_trainer(tmp_path, freeze_head=freeze_head)
    policy, ref = trainer.policy, trainer.ref
    text = {n for n, _ in policy.named_parameters() if n.startswith("text_encoder.")}
    head = {n for n, _ in policy.named_parameters() if n.startswith("diffloss.")}
    assert text and head
    ref_params = dict(ref.named_parameters())
    for name, p in policy.named_parameters():
        assert (ref_params[name] is p) == (name in text or (freeze_head and name in head)), name
        assert torch.equal(ref_params[name], p)
    assert {id(p) for p in trainer.params} == {id(p) for p in policy.parameters() if p.requires_grad}
    trainer.train_step()
    moved = [n for n, p in policy.named_parameters() if not torch.equal(p, ref_params[n])]
    assert moved and not set(moved) & text and (not freeze_head or not set(moved) & head)


def test_frozen_prefixes_keep_those_parameters_and_name_a_bad_prefix(tmp_path):
    trainer = make_trainer(tmp_path, frozen=["blocks.0."])
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters()}
    trainer.train_step()
    for n, p in trainer.policy.named_parameters():
        if n.startswith("blocks.0."):
            assert torch.equal(before[n], p) and not p.requires_grad, n
    assert any(
        not torch.equal(before[n], p) for n, p in trainer.policy.named_parameters() if n.startswith("blocks.1.")
    )
    with pytest.raises(ValueError, match=r"frozen: no parameter name of ToyMAR starts with 'llm\.'.*'blocks'"):
        make_trainer(tmp_path / "bad", frozen=["llm."])


def test_shared_group_noise_reaches_the_rollout(tmp_path, monkeypatch):
    import margrpo.grpo.trainer as trainer_module

    seen = {}
    real = trainer_module.generate

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "generate", spy)
    make_trainer(tmp_path, steps=1, group_order="shared", group_noise="shared").train_step()
    assert seen["shared_order"] and seen["shared_noise"]


def test_first_update_ratio_is_one_under_bf16_with_recomputed_old_log_probs(tmp_path):
    """bf16 rollout and batched replay may round differently; `recomputed` makes ratio == 1 exactly."""
    trainer = make_trainer(
        tmp_path, precision="bf16", steps=1, trajectories=2, freeze_head=True, old_logprob="recomputed"
    )
    row = trainer.train()[0]
    assert row["ratio_min"] == 1.0 and row["ratio_max"] == 1.0 and row["clip_frac"] == 0.0


def test_later_updates_use_log_probs_from_before_the_first_update(tmp_path):
    """updates_per_rollout = 2: the second update's log_prob_old is the pre-update pass; in float32
    that equals the record (to design.md §3.2's 1e-5), so `recomputed` and `recorded` log the same ratios."""
    rows = {}
    for old in ("recorded", "recomputed"):
        trainer = make_trainer(
            tmp_path / old,
            policy=tiny_policy("flow", seed=2),
            steps=1,
            updates_per_rollout=2,
            trajectories=2,
            old_logprob=old,
        )
        rows[old] = trainer.train()[0]
    assert rows["recorded"]["ratio_max"] > 1.0  # the second update sees moved parameters
    # every update's statistics: the first's ratio is 1 (its own pass), the step's columns are the last update's
    row = rows["recomputed"]
    assert row["u1/ratio_min"] == row["u1/ratio_max"] == 1.0 and row["u2/ratio_max"] == row["ratio_max"] > 1.0
    assert row["u1/skipped"] == row["u2/skipped"] == 0 and row["u1/grad_norm"] != row["u2/grad_norm"]
    # per-token log-probs here are sums over 768 channels of magnitude ~400-900, where one float32 ulp
    # is 3e-5-6e-5: the record and the pre-update pass may differ by an ulp (different batch shapes)
    for key in ("ratio_min", "ratio_max", "ratio_mean", "clip_frac", "policy_loss"):
        assert rows["recomputed"][key] == pytest.approx(rows["recorded"][key], rel=2e-4, abs=1e-7), key


def test_mte_covers_the_top_k_of_every_chosen_steps_loss_tokens(tmp_path):
    """Algorithm 2 / Eq. 10: at each chosen AR step, M^m holds round(k n) of the n tokens predicted there
    (per image), so Eq. 10 averages over S trajectories on a fraction k of the loss tokens (not only on
    the few tokens a step commits); every extra trajectory replays with ratio 1."""
    from helpers import assert_ratio_is_one

    trainer = make_trainer(
        tmp_path,
        trajectories=4,
        top_frac=0.3,
        freeze_head=True,
        mask_steps=3,
        policy=tiny_policy("flow", seed=3, patch_size=4),
        sampling=(sampling := SamplingConfig(ar_steps=6, diffusion_steps=5, cfg_scale=2.0)),
    )  # 64 tokens of 4 x 4 px
    ar, diff = trainer.choose_steps(torch.Generator().manual_seed(0))
    r = generate(
        trainer.policy,
        PROMPTS[:2],
        sampling,
        group_size=2,
        generator=torch.Generator().manual_seed(1),
        trajectories=4,
        mte_steps=ar,
        mte_generator=torch.Generator().manual_seed(2),
    )
    assert torch.equal(r.mte_steps, ar)
    mte, _ = trainer.masks(r)
    unknown = ~r.known[ar]  # [M, N, L]
    expected = torch.floor(unknown.sum(-1) * 0.3 + 0.5)  # [M, N]
    assert torch.equal(mte[ar].sum(-1).float(), expected) and not (mte[ar] & ~unknown).any()
    others = torch.ones(6, dtype=torch.bool)
    others[ar] = False
    assert not mte[others].any()  # no mask (and no extra trajectories) at the other steps
    tokens, _ = loss_weights(completion_mask(r, ar, diff, trainer.sampler), r, ar, None, trainer.cfg.loss_tokens)
    frac = float((mte[ar][:, None] * tokens).sum() / tokens.sum())
    assert abs(frac - 0.3) < 0.03, frac  # 0.3 up to per-image rounding
    assert_ratio_is_one(trainer.policy, r)


def test_mte_frac_is_logged_near_k(tmp_path):
    row = make_trainer(tmp_path, trajectories=3, top_frac=0.5, freeze_head=True, steps=1).train()[0]
    assert 0.4 < row["mte_frac"] < 0.6


@pytest.mark.parametrize(
    "kw,message",
    [
        ({"steps": -5}, r"steps \(-5\)"),
        ({"group_size": 1, "micro_batches": 1}, "group_size"),
        ({"tau": math.nan}, "tau must be a number"),
        ({"val_every": 0}, "val_every"),
    ],
)
def test_config_rejects_values_that_would_train_nothing_or_wrongly(kw, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**kw)


def test_from_spec_rejects_unknown_keys_instead_of_dropping_them():
    with pytest.raises(ValueError, match=r"unknown GRPO setting\(s\) \['stepz', 'topfrac'\]"):
        GRPOConfig.from_spec({"grpo": {"stepz": 3}, "variant": {"name": "sim", "report_step": None, "topfrac": 0.1}})
    assert GRPOConfig.from_spec({"grpo": {"steps": 3}, "variant": {"name": "fix", "freeze_head": True}}).freeze_head


def test_shuffled_advantages_are_the_group_advantages_permuted(tmp_path):
    """The no-signal control keeps the batch's advantages but detaches them from their images."""
    real = make_trainer(tmp_path / "a", policy=tiny_policy("flow", seed=2), batch_prompts=4, group_size=2)
    ctl = make_trainer(
        tmp_path / "b", policy=tiny_policy("flow", seed=2), batch_prompts=4, group_size=2, advantages="shuffled"
    )
    a, b = real.rollout_and_score(), ctl.rollout_and_score()
    assert torch.equal(a.rewards, b.rewards)  # the same rollout and scores
    assert torch.equal(a.adv.sort().values, b.adv.sort().values) and not torch.equal(a.adv, b.adv)
    assert math.isfinite(ctl.train()[-1]["policy_loss"])
    with pytest.raises(ValueError, match="advantages"):
        GRPOConfig(advantages="random")


def test_replay_chunk_is_checked_and_stays_out_of_the_cached_spec():
    from margrpo.experiment.config import load_config, train_spec

    with pytest.raises(ValueError, match="replay_chunk must be >= 1"):
        GRPOConfig(replay_chunk=0)
    config = load_config(Path(__file__).resolve().parents[1] / "config" / "smoke.yaml")
    assert (
        "replay_chunk" not in train_spec(config, "toy-nova", "toypref", "fix")["grpo"]
    )  # cached runs keep their spec
    config["grpo"]["replay_chunk"] = 2
    assert train_spec(config, "toy-nova", "toypref", "fix")["grpo"]["replay_chunk"] == 2


@pytest.mark.parametrize("variant", [{"freeze_head": True}, {"freeze_head": True, "trajectories": 3, "sim": True}])
def test_the_trainers_rollout_records_in_full_only_what_training_reads(tmp_path, monkeypatch, variant):
    """The chosen AR steps (and, for Sim, each one's predecessor) hold every unknown token's trajectory, the rest the
    committed tokens'; the images, the recorded log-probs, MTE's mask and Sim's kappa at the chosen steps are the
    same bits as with every step recorded (the same step's generators draw the same noise twice)."""
    import margrpo.grpo.trainer as trainer_module

    sampling = SamplingConfig(ar_steps=6, diffusion_steps=5, cfg_scale=2.0)
    trainer = make_trainer(tmp_path, mask_steps=1, sampling=sampling, **variant)
    some = trainer.rollout_and_score()
    ar, diff = some.ar_steps, some.diffusion_steps
    wanted = set(ar.tolist()) | ({max(int(ar[0]) - 1, 0)} if trainer.cfg.sim else set())
    assert set(some.rollout.full.nonzero().flatten().tolist()) == wanted
    every_step = trainer_module.generate
    monkeypatch.setattr(trainer_module, "generate", lambda *a, **kw: every_step(*a, **{**kw, "full_steps": None}))
    every = trainer.rollout_and_score()
    assert every.rollout.full is None and torch.equal(every.rollout.images, some.rollout.images)
    assert torch.equal(recorded(some.rollout, ar, diff)[0], recorded(every.rollout, ar, diff)[0])
    for a, b in ((some.mte_mask, every.mte_mask), (some.sim_keep, every.sim_keep)):
        assert (a is None) == (b is None) and (a is None or torch.equal(a[ar], b[ar]))


def test_the_policy_settings_check_themselves_and_name_the_schema_shardings():
    from margrpo.experiment.schema import schema_section
    from margrpo.policy.settings import SHARDINGS

    assert schema_section("policies.*")["properties"]["sharding"]["enum"] == list(SHARDINGS)
    with pytest.raises(ValueError, match="sharding must be one of replicate, full_shard"):
        PolicySettings(sharding="zero3")
    with pytest.raises(ValueError, match=r"unknown policy setting\(s\) \['rl_frozen'\]"):
        PolicySettings.from_spec({"policy": {"rl_frozen": ["llm."]}})
    assert PolicySettings.from_spec({"grpo": {}}) == PolicySettings()
    assert PolicySettings.from_spec({"policy": {"frozen": ["llm."]}}).frozen == ("llm.",)
