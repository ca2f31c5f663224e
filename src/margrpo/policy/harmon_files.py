"""Harmon's published folders, read into `HarmonPolicy`: the `.pth` release and the transformers-format folder.

1. The release (huggingface.co/wusize/harmon plus the LLM's config), the layout `HarmonPolicy.save_pretrained` writes:

       <dir>/harmon_1.5b.pth          Harmon's weights: llm.*, mar.*, proj_in.*, proj_out.* (no vae.*)
       <dir>/kl16.ckpt                MAR's KL-16 VAE: {"model": LDM-style state dict}
       <dir>/Qwen2.5-1.5B-Instruct/   config.json, tokenizer.json, tokenizer_config.json of
                                      Qwen/Qwen2.5-1.5B-Instruct (its weights, if present, are not read)
       <dir>/config.json              optional: {"model_type": "harmon", ...HarmonConfig}; when absent
                                      the Harmon-1.5B values are used (`HarmonConfig()`)

   Weights load with `torch.load(weights_only=True)`, strictly; the VAE runs as `diffusers.AutoencoderKL` with the
   LDM key names mapped on load and save.
2. The transformers-format `wusize/Harmon-1_5B` folder that AMAP-ML/mar-grpo loads
   (`HarmonModel.from_pretrained(model)` and `AutoTokenizer.from_pretrained(model)` in
   src/grpo/src/open_r1/trainer/grpo_trainer_harmon_v1_2.py). Its key map is read from the code that defines it,
   AMAP-ML/mar-grpo src/grpo/src/harmon/: `configuration_harmon.py` (config.json: model_type "harmon", `llm` =
   a Qwen2Config dict, `mar` = {"type": "mar_base" | "mar_large" | "mar_huge", MAR's keyword arguments}),
   `modeling_harmon.py` (HarmonModel: submodules `vae` = vae.AutoencoderKL(embed_dim=16, ch_mult=(1, 1, 2, 2, 4)),
   `llm` = Qwen2ForCausalLM, `mar` = mar.py's preset, `proj_in` / `proj_out` = Linear-SiLU-Linear), `mar.py`
   (the presets' widths, depths and heads) and `vae.py` (LDM names) -- the same classes as wusize/Harmon's
   src/models/mar/{mar,vae}.py and src/models/harmon.py, whose `.pth` release we already load. So its state dict
   is the `.pth`'s keys unchanged plus `vae.` + kl16.ckpt's LDM keys, saved by transformers as `model.safetensors`
   (or shards with `model.safetensors.index.json`, the tied `llm.lm_head.weight` possibly left out), with the
   Qwen tokenizer files beside it. Its remote code is never run (no trust_remote_code): the config is mapped to a
   `HarmonConfig` here and the weights load into our classes with strict key and shape checks.

A folder may also be a Hugging Face repository id in the local cache (`margrpo.infra.weights.resolve_weights`).
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import torch
from torch import Tensor

from margrpo.infra.files import InputError, verify_outside
from margrpo.infra.weights import load_tensor_file, resolve_weights
from margrpo.policy.base import MARPolicy  # the policy class itself comes in as `cls`
from margrpo.policy.harmon_config import HarmonConfig

CONFIG = "config.json"
LLM_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
HF_WEIGHTS, HF_INDEX = "model.safetensors", "model.safetensors.index.json"
# mar.py's presets (mar_base / mar_large / mar_huge): widths, depths and heads of the encoder and decoder
MAR_PRESETS = {
    name: dict(
        encoder_width=w,
        encoder_depth=d,
        encoder_heads=h,
        decoder_width=w,
        decoder_depth=d,
        decoder_heads=h,
        mlp_ratio=4.0,
    )
    for name, (w, d, h) in {"mar_base": (768, 12, 12), "mar_large": (1024, 16, 16), "mar_huge": (1280, 20, 16)}.items()
}
# What config.json does not record, so HarmonConfig's defaults (tests shrink this table): modeling_harmon.py fixes
# the KL-16 VAE (embed_dim 16, ch 128, ch_mult (1, 1, 2, 2, 4), 2 blocks) and vae_scale; the generation size is
# an argument of its sampler (512 px in MAR-GRPO's trainer and Harmon's scripts).
HF_FIXED = {
    f.name: getattr(HarmonConfig(), f.name)
    for f in fields(HarmonConfig)
    if f.name.startswith("vae_") or f.name == "image_size"
}
# MAR keyword arguments in config.json's `mar` -> HarmonConfig fields; `None`: training-only, not used here
MAR_ARGS = {
    "img_size": "pos_embed_size",
    "patch_size": "patch_size",
    "class_num": "num_classes",
    "buffer_size": "buffer_size",
    "diffloss_d": "head_depth",
    "diffloss_w": "head_width",
    "attn_dropout": "dropout",
    "proj_dropout": "dropout",
    "vae_stride": None,
    "vae_embed_dim": None,
    "mask_ratio_min": None,
    "label_drop_prob": None,
    "num_sampling_steps": None,
    "diffusion_batch_mul": None,
    "grad_checkpointing": None,
}


# ============================================================================ which folder
def read_raw_config(d: Path) -> dict | None:
    """config.json as a dict (None: absent)."""
    if not (d / CONFIG).exists():
        return None
    try:
        raw = json.loads((d / CONFIG).read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{d / CONFIG}: unreadable JSON ({err})") from err
    if not isinstance(raw, dict):
        raise InputError(f"{d / CONFIG}: expected a JSON object")
    return raw


def is_transformers_format(raw: dict | None) -> bool:
    return raw is not None and raw.get("model_type") == "harmon" and "mar" in raw and "llm" in raw


def is_harmon_folder(path: str | Path) -> bool:
    """Our config.json (model_type "harmon"), the transformers-format folder, or (no config.json) the release files."""
    try:
        d = resolve_weights(path)
        raw = read_raw_config(d)
    except (FileNotFoundError, InputError):
        return False
    if raw is not None:
        return raw.get("model_type") == "harmon"
    return any((d / name).is_file() for name in (HarmonConfig.weights_name, HarmonConfig.vae_name))


def load_harmon(
    cls: type[MARPolicy],
    local_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> MARPolicy:
    """Either layout above; nothing is downloaded. Missing files raise FileNotFoundError naming every expected path;
    unreadable files and key mismatches raise ValueError naming the file. dtype None keeps float32."""
    d = resolve_weights(local_dir)
    if not d.is_dir():
        raise FileNotFoundError(
            f"{d}: no such checkpoint folder (expected harmon_1.5b.pth, kl16.ckpt, Qwen2.5-1.5B-Instruct/, "
            "or the transformers-format Harmon-1_5B folder: config.json, model.safetensors, tokenizer files)"
        )
    verify_outside(d, "Harmon")  # released weights carry no manifest; margrpo's checkpoints do
    raw = read_raw_config(d)
    if is_transformers_format(raw):
        return _load_transformers_format(cls, d, raw, device, dtype)
    return _load_release(cls, d, raw, device, dtype)


# ============================================================================ 1. the .pth release
def _load_release(cls, d: Path, raw: dict | None, device, dtype) -> MARPolicy:
    config = _our_config(d, raw)
    expected = [d / config.weights_name, d / config.vae_name] + [d / config.llm_dir / f for f in LLM_FILES]
    if missing := [str(p) for p in expected if not p.is_file()]:
        raise FileNotFoundError(
            f"{d}: not a complete Harmon checkpoint folder; missing {', '.join(missing)} "
            f"(expected {config.weights_name}, {config.vae_name} and {config.llm_dir}/{{{', '.join(LLM_FILES)}}}, "
            "or the transformers-format Harmon-1_5B folder)"
        )
    llm_config = d / config.llm_dir / "config.json"
    config.llm = _read_json(llm_config)
    if config.llm.get("model_type") != "qwen2":
        raise ValueError(f"{llm_config}: model_type is {config.llm.get('model_type')!r}, expected 'qwen2' (Qwen2.5)")
    model = _build(cls, config, d / config.llm_dir, device)
    harmon = load_tensor_file(d / config.weights_name)
    if isinstance(harmon.get("state_dict"), dict):  # a training checkpoint wrapping the weights
        harmon = harmon["state_dict"]
    ldm = load_tensor_file(d / config.vae_name)
    ldm = ldm["model"] if isinstance(ldm.get("model"), dict) else ldm
    _load_into(model, harmon, d / config.weights_name, ldm, d / config.vae_name)
    return model.to(dtype=dtype).eval() if dtype is not None else model.eval()


def _our_config(d: Path, raw: dict | None) -> HarmonConfig:
    """config.json if present (ours), else the Harmon-1.5B defaults (a folder of the published files)."""
    if raw is None:
        return HarmonConfig()
    raw = dict(raw)
    if raw.pop("model_type", None) != "harmon":
        raise ValueError(f"{d / CONFIG}: model_type is not 'harmon'")
    known = {f.name for f in fields(HarmonConfig)} - {"llm"}
    if unknown := sorted(set(raw) - known):
        raise ValueError(f"{d / CONFIG}: unknown HarmonConfig fields {unknown}")
    return HarmonConfig(**raw)


# ============================================================================ 2. the transformers-format folder
def config_from_transformers(raw: dict, where: Path) -> HarmonConfig:
    """HarmonConfig of a Harmon-1_5B config.json (configuration_harmon.py's `llm` and `mar`)."""
    mar = dict(raw["mar"])
    preset = mar.pop("type", None)
    if preset not in MAR_PRESETS:
        raise ValueError(f"{where}: mar.type is {preset!r}; expected one of {sorted(MAR_PRESETS)} (mar.py's presets)")
    if unknown := sorted(set(mar) - set(MAR_ARGS)):
        raise ValueError(f"{where}: unknown MAR arguments {unknown} in `mar`; known: {sorted(MAR_ARGS)}")
    if mar.get("attn_dropout", 0.1) != mar.get("proj_dropout", 0.1):
        raise ValueError(f"{where}: attn_dropout and proj_dropout differ; margrpo's MAR-H has one dropout rate")
    stride, channels = 2 ** (len(HF_FIXED["vae_channels"]) - 1), HF_FIXED["vae_latent_channels"]
    if mar.get("vae_stride", stride) != stride or mar.get("vae_embed_dim", channels) != channels:
        raise ValueError(
            f"{where}: mar.vae_stride / vae_embed_dim ({mar.get('vae_stride')}, {mar.get('vae_embed_dim')}) do not "
            f"match the VAE HarmonModel builds (stride {stride}, {channels} channels)"
        )
    settings = {MAR_ARGS[k]: v for k, v in mar.items() if MAR_ARGS[k] is not None}
    llm = raw["llm"]
    if not isinstance(llm, dict) or llm.get("model_type", "qwen2") != "qwen2":
        raise ValueError(f"{where}: `llm` must be a Qwen2 config (model_type 'qwen2')")
    return HarmonConfig(llm={"model_type": "qwen2", **llm}, **MAR_PRESETS[preset], **HF_FIXED, **settings)


def _load_transformers_format(cls, d: Path, raw: dict, device, dtype) -> MARPolicy:
    config = config_from_transformers(raw, d / CONFIG)
    shards, source = _safetensors_shards(d)
    model = _build(cls, config, d, device)
    from safetensors.torch import load_file

    state: dict[str, Tensor] = {}
    for shard in shards:
        try:
            state.update(load_file(str(shard)))
        except Exception as err:  # safetensors' own error types for truncated or junk files
            raise ValueError(f"{shard}: corrupt or unreadable safetensors file ({err})") from err
    vae = {k.removeprefix("vae."): state.pop(k) for k in [k for k in state if k.startswith("vae.")]}
    _load_into(model, state, source, vae, source)
    return model.to(dtype=dtype).eval() if dtype is not None else model.eval()


def _safetensors_shards(d: Path) -> tuple[list[Path], Path]:
    """The weight files of a transformers folder: model.safetensors, or the shards its index names."""
    if (d / HF_WEIGHTS).is_file():
        return [d / HF_WEIGHTS], d / HF_WEIGHTS
    if (d / HF_INDEX).is_file():
        weight_map = _read_json(d / HF_INDEX).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{d / HF_INDEX}: no weight_map")
        shards = [d / name for name in sorted(set(weight_map.values()))]
        if missing := [str(s) for s in shards if not s.is_file()]:
            raise FileNotFoundError(f"{d / HF_INDEX}: names shards that are missing: {', '.join(missing)}")
        return shards, d / HF_INDEX
    raise FileNotFoundError(
        f"{d}: a transformers-format Harmon folder (config.json with llm and mar) but no {HF_WEIGHTS} or {HF_INDEX}"
    )


# ============================================================================ shared
def _build(cls, config: HarmonConfig, tokenizer_dir: Path, device) -> MARPolicy:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=False, local_files_only=True)
    except Exception as err:
        raise ValueError(f"{tokenizer_dir}: unreadable tokenizer ({err})") from err
    with torch.device(device):
        return cls(config, tokenizer)


def _load_into(model: MARPolicy, harmon: dict, harmon_file: Path, ldm: dict, vae_file: Path) -> None:
    """Harmon's own weights and the VAE under its LDM names (1x1-conv attention -> linear), strictly."""
    from margrpo.policy.mar_h import vae_key_to_ldm  # with diffusers: only where a Harmon folder loads

    if model.llm.config.tie_word_embeddings and "llm.model.embed_tokens.weight" in harmon:
        harmon.setdefault("llm.lm_head.weight", harmon["llm.model.embed_tokens.weight"])  # tied: may be stored once
    check_keys(harmon_file, harmon, model.harmon_state_dict())
    check_keys(
        vae_file,
        {f"vae.{k}": v for k, v in ldm.items()},
        {f"vae.{k}": v for k, v in model.vae_state_dict_ldm().items()},
    )
    own = model.vae.state_dict()
    name = {vae_key_to_ldm(k, len(model.config.vae_channels)): k for k in own}
    vae = {f"vae.{name[k]}": v.reshape(own[name[k]].shape) for k, v in ldm.items()}
    model.load_state_dict({**harmon, **vae}, strict=True)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable JSON ({err})") from err


def check_keys(path: Path, found: dict, expected: dict[str, Tensor], show: int = 5) -> None:
    """Strict key and shape check with a readable message (the first few offenders of each kind)."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = [
        f"{k}: {tuple(getattr(found[k], 'shape', ()))} instead of {tuple(expected[k].shape)}"
        for k in sorted(set(found) & set(expected))
        if not isinstance(found[k], Tensor) or found[k].shape != expected[k].shape
    ]
    if missing or unexpected or shapes:
        parts = [
            f"{len(v)} {name}: {v[:show]}"
            for name, v in (("missing", missing), ("unexpected", unexpected), ("with wrong shapes", shapes))
            if v
        ]
        raise ValueError(
            f"{path}: does not match the model ({'; '.join(parts)}); is the HarmonConfig right for this checkpoint?"
        )
