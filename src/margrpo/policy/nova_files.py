"""NOVA's published folder: the diffusers layout of BAAI/nova-d48w1024-sd512, read and written.

    model_index.json                         {"_class_name": "NOVAPipeline", ...}
    scheduler/scheduler_config.json          FlowMatchEulerDiscreteScheduler (its `shift`)
    transformer/config.json                  NOVA's arch names (`NovaConfig.from_nova_json`)
    transformer/diffusion_pytorch_model.safetensors
    vae/                                     diffusers AutoencoderKL
    text_encoder/                            transformers PhiModel (one file, or shards with an index)
    tokenizer/

A folder is a local path or a Hugging Face repository id (`BAAI/nova-d48w1024-sd512[@revision]`) found in the
local Hugging Face cache (`margrpo.infra.weights.resolve_weights`); nothing is downloaded, no checkpoint code runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from margrpo.infra.files import read_json, record_checksums, save_safetensors, state_mismatch, verify_outside
from margrpo.infra.weights import NOVA_LAYOUT, missing_files, resolve_weights
from margrpo.policy.base import MARPolicy  # the policy class itself comes in as `cls`
from margrpo.policy.nova_config import TRANSFORMER_WEIGHTS, NovaConfig


def save_nova(policy: MARPolicy, directory: str | Path, copy_frozen: bool = False) -> None:
    """Write the layout above (tiny test models round-trip through it).

    The frozen vae/, text_encoder/ and tokenizer/ never change, so for a policy loaded from a folder they become
    symlinks to that folder's (Phi-2 alone is 5-11 GB per GRPO checkpoint otherwise); `copy_frozen=True`, or a
    policy built in memory, writes them out.
    """
    d = Path(directory)
    (d / "transformer").mkdir(parents=True, exist_ok=True)
    (d / "scheduler").mkdir(exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in policy.transformer.state_dict().items()}
    save_safetensors(state, d / "transformer" / TRANSFORMER_WEIGHTS)
    _write_json(d / "transformer" / "config.json", policy.config.to_nova_json())
    scheduler = {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000}
    _write_json(d / "scheduler" / "scheduler_config.json", {**scheduler, "shift": policy.config.flow_shift})
    for name, part in (("vae", policy.vae), ("text_encoder", policy.text_encoder), ("tokenizer", policy.tokenizer)):
        target = d / name
        if target.is_symlink():
            target.unlink()
        if policy.source_dir is not None and not copy_frozen and not target.exists():
            target.symlink_to(policy.source_dir / name, target_is_directory=True)
        else:
            part.save_pretrained(str(target))
    _write_json(
        d / "model_index.json",
        {
            "_class_name": "NOVAPipeline",
            "_margrpo_model_type": policy.model_type,
            "transformer": ["margrpo", "NovaTransformer"],
            "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
            "vae": ["diffusers", "AutoencoderKL"],
            "text_encoder": ["transformers", "PhiModel"],
            "tokenizer": ["transformers", type(policy.tokenizer).__name__],
        },
    )
    record_checksums(d)  # what this folder itself holds (not the linked frozen parts); checked on load


def is_nova_folder(directory: str | Path) -> bool:
    """True for a NOVA pipeline folder (published or written by save_pretrained), local or in the HF cache."""
    try:
        index = resolve_weights(directory) / "model_index.json"
    except FileNotFoundError:
        return False
    return index.is_file() and read_json(index).get("_class_name") == "NOVAPipeline"


def load_nova(
    cls: type[MARPolicy], directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> MARPolicy:
    """Load the folder above. Missing files raise FileNotFoundError naming every expected path; a corrupt or
    mismatching transformer checkpoint raises ValueError naming the file. dtype defaults to float32."""
    from diffusers import AutoencoderKL
    from transformers import AutoTokenizer, PhiModel

    d = resolve_weights(directory)
    if missing := missing_files(d, NOVA_LAYOUT):
        raise FileNotFoundError(f"{d}: not a NOVA pipeline folder; missing {'; '.join(missing)}")
    verify_outside(d, "NOVA")  # released weights carry no manifest; margrpo's checkpoints do
    shift = 1.0
    if (d / "scheduler" / "scheduler_config.json").is_file():
        shift = float(read_json(d / "scheduler" / "scheduler_config.json").get("shift", 1.0))
    config = NovaConfig.from_nova_json(read_json(d / "transformer" / "config.json"), flow_shift=shift)
    dtype = dtype or torch.float32
    text_encoder = PhiModel.from_pretrained(
        str(d / "text_encoder"), torch_dtype=dtype, attn_implementation="sdpa", local_files_only=True
    )
    vae = AutoencoderKL.from_pretrained(str(d / "vae"), torch_dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(d / "tokenizer"), local_files_only=True)
    policy = cls(config, text_encoder, vae, tokenizer)
    _load_strict(policy.transformer, d / "transformer" / TRANSFORMER_WEIGHTS)
    policy.source_dir = d.resolve()
    return policy.to(device=device, dtype=dtype)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _load_strict(module: nn.Module, path: Path) -> None:
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except Exception as err:  # safetensors raises its own error types for truncated or junk files
        raise ValueError(f"{path}: corrupt or unreadable safetensors file ({err})") from err
    if mismatch := state_mismatch(state, module.state_dict()):
        raise ValueError(f"{path}: does not match transformer/config.json; {mismatch}")
    module.load_state_dict(state, strict=True)
