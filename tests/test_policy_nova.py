"""NOVA policy on a tiny random config: the rollout invariant, a GRPO step, persistence, checkpoint layout."""

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from builders_policies import tiny_nova
from helpers import PROMPTS, redness
from policy_contract import PolicyContract
from safetensors.torch import load_file, save_file

from margrpo.grpo.rollout import SamplingConfig, generate, unknown_after_steps
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
from margrpo.policy import load_policy
from margrpo.policy.nova import NovaConfig, NovaPolicy, NovaTransformer
from margrpo.policy.nova_files import is_nova_folder
from margrpo.prompts.suites import PromptSet

SAMPLING = SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=3.0, cfg_schedule="linear", temperature=0.9)
TSV = Path(__file__).resolve().parents[1] / "src/margrpo/policy/params/nova-d48w1024-sd512.tsv"
WEIGHTS = Path("transformer") / "diffusion_pytorch_model.safetensors"


class TestNovaContract(PolicyContract):  # tests/policy_contract.py
    build = staticmethod(tiny_nova)


def rollout(policy, seed=0, trajectories=1):
    return generate(
        policy,
        PROMPTS[:2],
        SAMPLING,
        group_size=2,
        generator=torch.Generator().manual_seed(seed),
        trajectories=trajectories,
        mte_generator=torch.Generator().manual_seed(seed + 99),
    )


def test_null_prompt_is_the_filler_table():
    """NOVA's CFG null text is the empty prompt: no Phi features, only TextEmbed's filler rows."""
    policy = tiny_nova()
    null = policy.null_condition(2)
    filler = policy.transformer.text_embed.weight[: policy.config.text_token_len]
    assert torch.equal(null.hidden, filler.expand(2, -1, -1)) and null.mask.all()
    cond = policy.encode_prompts(["a red circle"])
    assert not torch.equal(cond.hidden[0, :3], filler[:3]) and torch.equal(cond.hidden[0, 3:], filler[3:])


def test_token_layout_matches_the_patch_convolution():
    """Tokens are NOVA's patchify order, so the per-token projection equals the Conv2d on the latent."""
    policy = tiny_nova()
    latent = torch.randn(2, 4, 8, 8)
    tokens = policy.patchify(latent)
    assert torch.equal(policy.unpatchify(tokens), latent)
    pe = policy.transformer.image_encoder.patch_embed
    conv = pe.proj(latent).flatten(2).transpose(1, 2)  # [B, L, W], row-major
    torch.testing.assert_close(pe(tokens), conv, atol=1e-5, rtol=1e-5)
    images = policy.decode(policy.encode(torch.rand(2, 3, 64, 64)))
    assert images.shape == (2, 3, 64, 64) and 0 <= images.min() and images.max() <= 1


def test_parameter_groups_exclude_the_frozen_encoders():
    policy = tiny_nova()
    ar, head = set(map(id, policy.ar_parameters())), set(map(id, policy.head_parameters()))
    assert not ar & head and ar | head == set(map(id, policy.transformer.parameters()))
    frozen = list(policy.text_encoder.parameters()) + list(policy.vae.parameters())
    assert not any(p.requires_grad for p in frozen) and not {id(p) for p in frozen} & (ar | head)
    sampler = policy.make_sampler(25)
    assert sampler.config.shift == 1.5 and float(sampler.model_time(0)) == pytest.approx(1000.0)


def test_frame_condition_is_computed_once_per_rollout_and_changes_nothing(monkeypatch):
    """The video encoder depends on the prompt alone: one pass per branch per rollout (and per replay),
    not one per AR step, with the same samples and log-probs as recomputing it every step."""
    policy = tiny_nova()
    calls = []
    real = policy.transformer.frame_condition
    monkeypatch.setattr(policy.transformer, "frame_condition", lambda h: calls.append(len(h)) or real(h))
    cached = generate(policy, PROMPTS[:2], SAMPLING, group_size=2, generator=torch.Generator().manual_seed(0))
    assert calls == [2, 4]  # the conditional branch per prompt, the unconditional one per image
    monkeypatch.setattr(policy, "prepare_condition", lambda cond: cond)  # the per-step path
    calls.clear()
    per_step = generate(policy, PROMPTS[:2], SAMPLING, group_size=2, generator=torch.Generator().manual_seed(0))
    assert len(calls) == SAMPLING.ar_steps
    torch.testing.assert_close(cached.latents, per_step.latents, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cached.log_probs, per_step.log_probs, rtol=1e-5, atol=1e-5)


def novas_time_grid(num_steps: int, shift: float, num_train_timesteps: int = 1000) -> np.ndarray:
    """NOVA's FlowMatchEulerDiscreteScheduler (diffnext/schedulers/scheduling_cfm.py), step by step in float32:
    the constructor shifts the training sigmas 1..1/1000 and keeps their ends; set_timesteps spans
    linspace(t_max, t_min, T) between those ends and shifts the result again, then appends 0."""

    def shifted(s):
        return shift * s / (1 + (shift - 1) * s)

    train = shifted(np.arange(1, num_train_timesteps + 1, dtype="float32")[::-1] / num_train_timesteps)
    t_max, t_min = float(train[0]) * num_train_timesteps, float(train[-1]) * num_train_timesteps
    sigmas = np.linspace(t_max, t_min, num_steps, dtype="float32") / num_train_timesteps
    return np.append(shifted(sigmas), 0.0)


@pytest.mark.parametrize("shift", [1.0, 3.0])
def test_time_grid_is_novas_at_every_shift(shift):
    """Equal to NOVA's scheduler at shift 1 and at shift 3, where its last step is the minimum shifted twice."""
    policy = tiny_nova()
    policy.config.flow_shift = shift
    sigmas = policy.make_sampler(25).sigmas.numpy()
    np.testing.assert_allclose(sigmas, novas_time_grid(25, shift), rtol=1e-6, atol=0)
    twice = 3 * (3e-3 / 1.002) / (1 + 2 * (3e-3 / 1.002))  # w(w(0.001)) at s = 3
    assert sigmas[-2] == pytest.approx(0.001 if shift == 1 else twice, rel=1e-9)
    assert shift == 1 or sigmas[-2] == pytest.approx(0.00893, abs=5e-6)


def test_sampling_schedule_is_novas():
    """NOVA's pipeline: per-step token counts from np.round of the cosine mask lengths, and its Euler
    scheduler's time grid (set_timesteps: linspace(1000, 1, T) / 1000, shifted, then 0)."""
    policy = tiny_nova()

    def novas(L, K):  # num_preds as NOVA's pipeline computes them; generate_frame skips the zeros
        lengths = np.round(np.cos(0.5 * np.pi * np.arange(K + 1) / K) * L).astype("int64")
        return [int(n) for n in lengths[:-1] - lengths[1:] if n > 0]

    for L, K, steps in ((1024, 64, 63), (4096, 64, 64), (256, 16, 16), (64, 8, 8), (16, 16, 13)):
        left = unknown_after_steps(L, K, policy.mask_rounding)
        assert [a - b for a, b in zip([L] + left[:-1], left)] == novas(L, K) and len(left) == steps, (L, K)
    T = 25
    sigmas = novas_time_grid(T, policy.config.flow_shift)
    sampler = policy.make_sampler(T)
    np.testing.assert_allclose(sampler.sigmas.numpy(), sigmas, rtol=1e-6)
    np.testing.assert_allclose(sampler.model_time(torch.arange(T)).numpy(), sigmas[:-1] * 1000, rtol=1e-6)
    r = generate(
        policy,
        PROMPTS[:1],
        SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=2.0),
        generator=torch.Generator().manual_seed(0),
    )
    assert r.committed.sum((1, 2)).tolist() == novas(policy.seq_len, 4)


def test_one_grpo_step_updates_the_ar_parameters(tmp_path):
    policy = tiny_nova()
    prompts = PromptSet(PROMPTS, [{}] * len(PROMPTS))
    cfg = GRPOConfig(
        steps=1,
        batch_prompts=2,
        group_size=2,
        mask_steps=3,
        diffusion_steps=3,
        save_every=1,
        val_every=1,
        val_prompts=2,
        precision="no",
        lr=1e-3,
    )
    sampling = SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=2.0)
    trainer = GRPOTrainer(policy, redness, prompts, prompts, sampling, cfg, tmp_path)
    trainable = {
        n: p.detach().clone()
        for n, p in policy.transformer.named_parameters()
        if p.requires_grad and not n.startswith("image_decoder.")
    }
    rows = trainer.train()
    for key in ("reward_mean", "policy_loss", "kl_paper", "grad_norm_ar"):
        assert math.isfinite(rows[-1][key]), key
    params = dict(policy.transformer.named_parameters())
    unchanged = [n for n, before in trainable.items() if torch.equal(before, params[n])]
    assert not unchanged, unchanged


def test_a_saved_folder_is_novas_layout_and_a_loaded_policy_links_its_frozen_parts(tmp_path):
    """The contract's round trip (TestNovaContract) aside: the folder is NOVA's, and a loaded policy saves its frozen
    parts as links to its own folder instead of copies."""
    policy = tiny_nova()
    policy.save_pretrained(tmp_path / "nova")
    assert is_nova_folder(tmp_path / "nova")
    load_policy(tmp_path / "nova").save_pretrained(tmp_path / "again")
    assert (tmp_path / "again" / "text_encoder").is_symlink() and (tmp_path / "again" / "vae").is_symlink()
    assert torch.equal(rollout(NovaPolicy.from_pretrained(tmp_path / "again")).images, rollout(policy).images)


def test_a_sharded_text_encoder_as_released_loads_to_the_same_rollout(tmp_path):
    """NOVA's release keeps its Phi text encoder in shards with an index (model.safetensors.index.json): a folder
    in that layout loads strictly and gives the rollout (images and recorded log-probs) of the same weights saved
    our way."""
    import shutil

    policy = tiny_nova()
    policy.save_pretrained(tmp_path / "nova")
    shutil.rmtree(tmp_path / "nova" / "text_encoder")
    policy.text_encoder.save_pretrained(tmp_path / "nova" / "text_encoder", max_shard_size="1KB")
    assert (tmp_path / "nova" / "text_encoder" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "nova" / "text_encoder").glob("model-*-of-*.safetensors"))) > 1
    loaded = load_policy(tmp_path / "nova")
    a, b = rollout(policy), rollout(loaded)
    assert torch.equal(a.images, b.images) and torch.equal(a.log_probs, b.log_probs)


def test_missing_and_corrupt_checkpoints_fail_clearly(tmp_path, caplog):
    with pytest.raises(FileNotFoundError, match="model_index.json"):
        NovaPolicy.from_pretrained(tmp_path / "absent")
    d = tmp_path / "nova"
    tiny_nova().save_pretrained(d)
    state = load_file(str(d / WEIGHTS))
    (d / WEIGHTS).unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(d / WEIGHTS))):
        NovaPolicy.from_pretrained(d)
    (d / WEIGHTS).write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=re.escape(str(d / WEIGHTS))):
        NovaPolicy.from_pretrained(d)
    state["extra.weight"] = torch.zeros(1)
    del state["mask_embed.bos_token"]
    save_file(state, str(d / WEIGHTS))
    (d / "checksums.json").unlink()  # else the recorded sha256 names the changed file first; here: the key check
    with pytest.raises(ValueError, match=r"missing \(1\): mask_embed\.bos_token.*unexpected \(1\): extra\.weight"):
        NovaPolicy.from_pretrained(d)
    assert (
        f"{d}: no checksums.json (not written by margrpo): "
        "loading the NOVA weights with strict key and shape checks only" in caplog.text
    )


def test_full_size_transformer_matches_the_published_parameter_list():
    expected = {}
    for line in TSV.read_text().splitlines():
        if line and not line.startswith("#"):
            name, shape = line.split("\t")
            expected[name] = tuple(int(s) for s in shape.split(","))
    with torch.device("meta"):
        model = NovaTransformer(NovaConfig.full_size())
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
    head = sum(p.numel() for p in model.image_decoder.parameters())
    assert 0.6e9 < sum(v.numel() for v in model.state_dict().values()) < 0.7e9 and head < 0.05e9


def test_published_config_json_parses_to_the_full_size_config():
    published = {
        "_class_name": "NOVATransformer3DModel",
        "image_dim": 4,
        "image_size": 512,
        "image_stride": 8,
        "text_token_dim": 2560,
        "text_token_len": 256,
        "video_base_size": [1, 16, 16],
        "image_base_size": [32, 32],
        "arch": ["vit_d16w1024", "vit_d32w1024", "mlp_d3w1280"],
    }
    config = NovaConfig.from_nova_json(published)
    assert config == NovaConfig.full_size() and NovaConfig.from_nova_json(config.to_nova_json()) == config
    with pytest.raises(ValueError, match="rotary_pos_embed"):
        NovaConfig.from_nova_json({**published, "rotary_pos_embed": True})
    with pytest.raises(ValueError, match="image_base_size"):
        NovaConfig(image_base_size=(64, 64))
