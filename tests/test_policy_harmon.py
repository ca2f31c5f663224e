"""Harmon-1.5B (ours) on a tiny random config: design.md §3.2 ratio == 1, a GRPO step, checkpoints, key table."""

from pathlib import Path

import pytest
import torch
from builders_policies import tiny_harmon, tiny_harmon_config
from helpers import PROMPTS, assert_ratio_is_one, redness
from policy_contract import PolicyContract

from margrpo.grpo.rollout import SamplingConfig, generate
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
from margrpo.policy import load_policy
from margrpo.policy.harmon import HarmonConfig, HarmonPolicy
from margrpo.policy.harmon_files import is_harmon_folder
from margrpo.policy.settings import PolicySettings
from margrpo.prompts.suites import PromptSet

PARAMS = Path(__file__).resolve().parents[1] / "src/margrpo/policy/params/harmon-1.5b.tsv"
SAMPLING = SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=3.0, cfg_schedule="linear", temperature=0.9)


class TestHarmonContract(PolicyContract):  # tests/policy_contract.py
    build = staticmethod(tiny_harmon)


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


def test_ratio_is_one_with_sdpa_attention():
    """The contract's ratio check (TestHarmonContract) runs eager attention; the LLM's sdpa kernels keep it too."""
    policy = tiny_harmon(attn_implementation="sdpa")
    r = rollout(policy, trajectories=2)
    policy.train()  # dropout 0.1 in the config must not leak into the replay
    assert_ratio_is_one(policy, r)


def test_bf16_rollouts_run():
    """Under the trainer's bf16 autocast, and with bf16 weights (`from_pretrained(dtype=...)`)."""
    policy = tiny_harmon()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        images = rollout(policy).images
    assert torch.isfinite(images).all()
    assert torch.isfinite(rollout(policy.to(torch.bfloat16)).images).all()


def test_prompt_and_null_prompt_use_harmons_chat_template():
    policy = tiny_harmon()
    seen = []
    tokenizer = policy.tokenizer
    policy.tokenizer = lambda texts, **kw: seen.extend(texts) or tokenizer(texts, **kw)
    policy.encode_prompts(["a red circle"])
    policy.null_condition(1)
    turn = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    assert seen == [turn.format("Generate an image: a red circle"), turn.format("Generate an image.")]


def test_unknown_tokens_do_not_influence_z():
    """Harmon drops the unknown tokens before the encoder: their values cannot matter."""
    policy = tiny_harmon().eval()
    known = torch.rand(2, policy.seq_len, generator=torch.Generator().manual_seed(0)) < 0.4
    tokens = torch.randn(2, policy.seq_len, policy.token_dim)
    cond = policy.encode_prompts(PROMPTS[:2])
    with torch.no_grad():
        z = policy.ar_forward(tokens, known, cond)
        z2 = policy.ar_forward(torch.where(known[..., None], tokens, torch.randn_like(tokens)), known, cond)
    assert z.shape == (2, policy.seq_len, policy.z_dim) and torch.equal(z, z2)


def test_one_grpo_step_trains_the_ar_parameters(tmp_path):
    policy = tiny_harmon()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
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
    rows = GRPOTrainer(policy, redness, prompts, prompts, SAMPLING, cfg, tmp_path).train()
    for key in ("reward_mean", "policy_loss", "kl_paper", "grad_norm_ar", "ratio_min", "ratio_max"):
        assert torch.isfinite(torch.tensor(rows[-1][key])), key
    assert rows[-1]["grad_norm_ar"] > 0
    ar = {n for n, p in policy.named_parameters() if any(p is q for q in policy.ar_parameters())}
    unchanged = sorted(n for n in ar if torch.equal(before[n], policy.get_parameter(n)))
    assert unchanged == ["mar.class_emb.weight"]  # MAR's class table is not used for text-to-image
    assert all(torch.equal(before[n], p) for n, p in policy.named_parameters() if n.startswith("vae."))


def test_official_scope_trains_mar_only_and_shares_the_llm_with_the_reference(tmp_path):
    """MAR-GRPO's Harmon runs train mar.* alone: `frozen` keeps the LLM and its projectors fixed and
    the reference policy holds them once, not as a copy."""
    policy = tiny_harmon()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
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
    frozen = PolicySettings(frozen=("llm.", "proj_in.", "proj_out."))
    trainer = GRPOTrainer(policy, redness, prompts, prompts, SAMPLING, cfg, tmp_path, policy_settings=frozen)
    ref = dict(trainer.ref.named_parameters())
    outside = [n for n, _ in policy.named_parameters() if not n.startswith("mar.")]
    assert all(ref[n] is policy.get_parameter(n) for n in outside)
    assert not any(ref[n] is p for n, p in policy.named_parameters() if n.startswith("mar."))
    trainer.train()
    moved = {n for n, p in policy.named_parameters() if not torch.equal(before[n], p)}
    assert moved and all(n.startswith("mar.") for n in moved)
    assert any(n.startswith("mar.diffloss.") for n in moved) and any(not n.startswith("mar.diffloss.") for n in moved)


def test_parameter_groups_partition_all_but_the_frozen_vae():
    policy = tiny_harmon()
    ar, head = set(map(id, policy.ar_parameters())), set(map(id, policy.head_parameters()))
    vae = set(map(id, policy.vae.parameters()))
    assert not ar & head and ar | head | vae == set(map(id, policy.parameters())) and not (ar | head) & vae
    assert not any(p.requires_grad for p in policy.vae.parameters())


def test_codec_shapes_and_range():
    policy = tiny_harmon()
    with torch.no_grad():
        tokens = policy.encode(torch.rand(2, 3, 32, 32))
        images = policy.decode(tokens)
    assert tokens.shape == (2, 64, 4) and policy.token_grid == (8, 8)
    assert images.shape == (2, 3, 32, 32) and images.min() >= 0 and images.max() <= 1


def test_a_saved_folder_has_harmons_release_files_and_loads_in_bf16(tmp_path):
    """The contract's round trip (TestHarmonContract) aside: the release's file names, the VAE under LDM's names, and
    a bf16 load."""
    tiny_harmon().save_pretrained(tmp_path)
    for name in (
        "harmon_1.5b.pth",
        "kl16.ckpt",
        "config.json",
        "Qwen2.5-1.5B-Instruct/config.json",
        "Qwen2.5-1.5B-Instruct/tokenizer.json",
    ):
        assert (tmp_path / name).is_file(), name
    assert (
        "encoder.down.2.attn.0.q.weight" in torch.load(tmp_path / "kl16.ckpt", weights_only=True)["model"]
    )  # LDM names
    half = HarmonPolicy.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert half.mar.z_proj.weight.dtype == torch.bfloat16


def test_harmon_folders_are_recognised_saved_published_and_not_otherwise(tmp_path):
    tiny_harmon().save_pretrained(tmp_path / "saved")
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "harmon_1.5b.pth").write_bytes(b"")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"model_type": "toy-mar"}')
    assert is_harmon_folder(tmp_path / "saved") and is_harmon_folder(tmp_path / "published")
    assert not is_harmon_folder(tmp_path / "other") and not is_harmon_folder(tmp_path)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="harmon_1.5b.pth.*kl16.ckpt"):
        HarmonPolicy.from_pretrained(tmp_path)
    tiny_harmon().save_pretrained(tmp_path / "p")
    (tmp_path / "p" / "kl16.ckpt").unlink()
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "p" / "kl16.ckpt")):
        HarmonPolicy.from_pretrained(tmp_path / "p")


@pytest.mark.parametrize("name", ["harmon_1.5b.pth", "kl16.ckpt"])
def test_corrupt_weights_are_named(tmp_path, name):
    tiny_harmon().save_pretrained(tmp_path)
    (tmp_path / name).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        HarmonPolicy.from_pretrained(tmp_path)


def test_key_mismatch_lists_the_keys(tmp_path):
    policy = tiny_harmon()
    policy.save_pretrained(tmp_path)
    state = policy.harmon_state_dict()
    state["mar.extra"] = state.pop("proj_out.2.bias")
    torch.save(state, tmp_path / "harmon_1.5b.pth")
    (
        tmp_path / "checksums.json"
    ).unlink()  # else the recorded sha256 names the changed file first; here: the key check
    with pytest.raises(
        ValueError, match=r"harmon_1\.5b\.pth.*missing: \['proj_out\.2\.bias'\].*unexpected: \['mar\.extra'\]"
    ):
        HarmonPolicy.from_pretrained(tmp_path)


def test_full_size_matches_the_checked_in_parameter_table():
    with torch.device("meta"):
        policy = HarmonPolicy(HarmonConfig.full_size())
    got = {k: str(list(v.shape)) for k, v in policy.harmon_state_dict().items()}
    rows = [line.split("\t") for line in PARAMS.read_text().splitlines() if line and not line.startswith("#")]
    want = dict(rows)
    assert len(want) == len(rows) and got == want
    assert (policy.seq_len, policy.token_dim, policy.z_dim, policy.token_grid) == (1024, 16, 1280, (32, 32))


# --- the transformers-format Harmon-1_5B folder (AMAP-ML/mar-grpo's HarmonModel.from_pretrained) ----------------
def write_transformers_folder(policy: HarmonPolicy, d: Path, shards: int = 1) -> dict:
    """The folder HarmonModel.save_pretrained writes (AMAP-ML/mar-grpo src/grpo/src/harmon/): config.json with
    model_type "harmon", `llm` (a Qwen2 config) and `mar` (mar.py's preset name + MAR's keyword arguments, as
    wusize/Harmon's configs/models/qwen2_5_1_5b_kl16_mar_h.py); the state dict of modeling_harmon.HarmonModel
    (submodules vae, llm, mar, proj_in, proj_out; vae.* under vae.py's LDM names), the tied lm_head left out;
    the tokenizer beside it."""
    from safetensors.torch import save_file

    c = policy.config
    d.mkdir(parents=True, exist_ok=True)
    mar = dict(
        type="mar_tiny",
        img_size=c.pos_embed_size,
        vae_stride=c.vae_stride,
        patch_size=c.patch_size,
        vae_embed_dim=c.vae_latent_channels,
        mask_ratio_min=0.7,
        label_drop_prob=0.1,
        class_num=c.num_classes,
        attn_dropout=c.dropout,
        proj_dropout=c.dropout,
        buffer_size=c.buffer_size,
        diffloss_d=c.head_depth,
        diffloss_w=c.head_width,
        num_sampling_steps="100",
        diffusion_batch_mul=4,
        grad_checkpointing=True,
    )
    raw = dict(model_type="harmon", architectures=["HarmonModel"], llm=dict(c.llm), mar=mar)
    raw["auto_map"] = {"AutoConfig": "configuration_harmon.HarmonConfig", "AutoModel": "modeling_harmon.HarmonModel"}
    (d / "config.json").write_text(__import__("json").dumps(raw))
    state = {k: v.contiguous() for k, v in policy.harmon_state_dict().items() if k != "llm.lm_head.weight"}
    state |= {f"vae.{k}": v.contiguous() for k, v in policy.vae_state_dict_ldm().items()}
    names = sorted(state)
    if shards == 1:
        save_file(state, str(d / "model.safetensors"))
    else:
        weight_map = {}
        for i in range(shards):
            part = names[i::shards]
            file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            save_file({k: state[k] for k in part}, str(d / file))
            weight_map |= dict.fromkeys(part, file)
        (d / "model.safetensors.index.json").write_text(__import__("json").dumps({"weight_map": weight_map}))
    policy.tokenizer.save_pretrained(str(d))
    return state


@pytest.fixture
def tiny_presets(monkeypatch):
    """mar.py's presets, modeling_harmon.py's fixed VAE and the generation size, shrunk to the tiny test config."""
    from margrpo.policy import harmon_files

    c = tiny_harmon_config()
    monkeypatch.setitem(
        harmon_files.MAR_PRESETS,
        "mar_tiny",
        dict(
            encoder_width=c.encoder_width,
            encoder_depth=c.encoder_depth,
            encoder_heads=c.encoder_heads,
            decoder_width=c.decoder_width,
            decoder_depth=c.decoder_depth,
            decoder_heads=c.decoder_heads,
            mlp_ratio=c.mlp_ratio,
        ),
    )
    monkeypatch.setattr(harmon_files, "HF_FIXED", {k: getattr(c, k) for k in harmon_files.HF_FIXED})


@pytest.mark.parametrize("shards", [1, 2])
def test_transformers_format_folder_gives_the_same_rollout_log_probs(tmp_path, tiny_presets, shards):
    policy = tiny_harmon(attn_implementation="sdpa")
    policy.save_pretrained(tmp_path / "ours")
    state = write_transformers_folder(policy, tmp_path / "Harmon-1_5B", shards)
    assert {"vae.encoder.down.0.block.0.norm1.weight", "vae.quant_conv.weight", "mar.fake_latent"} <= set(state)
    assert is_harmon_folder(tmp_path / "Harmon-1_5B")
    ours, theirs = load_policy(tmp_path / "ours"), load_policy(tmp_path / "Harmon-1_5B")
    assert theirs.config.encoder_width == policy.config.encoder_width and theirs.config.llm["hidden_size"] == 32
    a, b = rollout(ours), rollout(theirs)
    assert torch.equal(a.log_probs, b.log_probs) and torch.equal(a.images, b.images)


def test_transformers_format_checks_keys_strictly(tmp_path, tiny_presets):
    from safetensors.torch import save_file

    policy = tiny_harmon()
    state = write_transformers_folder(policy, tmp_path)
    state["mar.extra"] = state.pop("proj_out.2.bias")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(
        ValueError, match=r"model\.safetensors.*missing: \['proj_out\.2\.bias'\].*unexpected: \['mar\.extra'\]"
    ):
        HarmonPolicy.from_pretrained(tmp_path)
    state["proj_out.2.bias"] = state.pop("mar.extra")
    state["vae.quant_conv.weight"] = state["vae.quant_conv.weight"][:1]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"wrong shapes.*vae\.quant_conv\.weight"):
        HarmonPolicy.from_pretrained(tmp_path)


def test_transformers_format_refuses_an_unknown_preset(tmp_path, tiny_presets):
    import json

    write_transformers_folder(tiny_harmon(), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw["mar"]["type"] = "mar_giant"
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="mar.type is 'mar_giant'.*mar_huge"):
        HarmonPolicy.from_pretrained(tmp_path)


def test_full_size_transformers_config_maps_to_harmon_1_5b():
    """configs/models/qwen2_5_1_5b_kl16_mar_h.py's `mar` entry gives HarmonConfig's Harmon-1.5B sizes."""
    from margrpo.policy.harmon_files import config_from_transformers

    mar = dict(type="mar_huge", img_size=256, vae_stride=16, patch_size=1, vae_embed_dim=16, mask_ratio_min=0.7)
    mar |= dict(label_drop_prob=0.1, class_num=1000, attn_dropout=0.1, proj_dropout=0.1, buffer_size=64)
    mar |= dict(
        diffloss_d=12, diffloss_w=1536, num_sampling_steps="100", diffusion_batch_mul=4, grad_checkpointing=True
    )
    full = HarmonConfig.full_size()
    got = config_from_transformers({"model_type": "harmon", "llm": full.llm, "mar": mar}, Path("config.json"))
    assert got == full


def test_a_pickle_holding_more_than_tensors_is_refused_with_a_way_forward(tmp_path):
    import argparse

    policy = tiny_harmon()
    policy.save_pretrained(tmp_path)
    torch.save(
        {"state_dict": policy.harmon_state_dict(), "args": argparse.Namespace(lr=1e-4)}, tmp_path / "harmon_1.5b.pth"
    )
    (tmp_path / "checksums.json").unlink()
    with pytest.raises(ValueError) as err:
        HarmonPolicy.from_pretrained(tmp_path)
    message = str(err.value)
    assert str(tmp_path / "harmon_1.5b.pth") in message and "argparse.Namespace" in message
    assert "weights_only=True" in message and "safe_globals([argparse.Namespace])" in message
    assert "corrupt" not in message
    # the recipe in the message works and stays within weights_only
    with torch.serialization.safe_globals([argparse.Namespace]):
        ckpt = torch.load(tmp_path / "harmon_1.5b.pth", weights_only=True, map_location="cpu")
    torch.save({k: v for k, v in ckpt.items() if isinstance(v, (dict, torch.Tensor))}, tmp_path / "harmon_1.5b.pth")
    assert torch.equal(rollout(HarmonPolicy.from_pretrained(tmp_path)).images, rollout(policy).images)
