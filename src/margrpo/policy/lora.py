"""LoRA adapters (peft) on the Linear layers of a policy's AR transformer (`MARPolicy.lora_scope`).

Everything else is frozen, and the policy with its adapters disabled *is* the pre-RL reference, so no deep copy is
kept. The policy keeps its class and its own state-dict keys (base weights only, as without LoRA, so checkpoints load
everywhere); the adapters travel apart, in adapter_model.safetensors + adapter_config.json (`save_adapters` /
`load_adapters`, which `margrpo.policy.load_policy` applies when a folder has them)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"
_BASE = "base_layer."


def lora_config(policy: nn.Module, options: dict):
    """peft's LoraConfig from `{rank, alpha, dropout, target_modules}`; the targets are leaf names of
    Linear layers, matched only inside the policy's AR transformer (`lora_scope`, a regex)."""
    from peft import LoraConfig

    scope = getattr(policy, "lora_scope", None)
    if scope is None:
        raise ValueError(f"{type(policy).__name__} does not support LoRA (no lora_scope)")
    targets = options.get("target_modules") or policy.lora_targets
    rank = int(options.get("rank", 8))
    pattern = rf"{scope}(?:.*\.)?(?:{'|'.join(map(re.escape, targets))})"
    return LoraConfig(
        r=rank,
        lora_alpha=options.get("alpha") or rank,
        lora_dropout=options.get("dropout", 0.0),
        target_modules=pattern,
    )


def lora_leaves(policy: nn.Module) -> set[str]:
    """What `target_modules` may name: the Linear layers inside `lora_scope`, relative to their block
    (`attn.qkv`; a target matches a leaf or its last dotted parts, as `lora_config`'s pattern does)."""
    scope = re.compile(policy.lora_scope)
    matches = ((n, scope.match(n)) for n, m in policy.named_modules() if isinstance(m, nn.Linear))
    return {n[m.end() :] for n, m in matches if m and m.end() < len(n)}


def add_lora(policy: nn.Module, options: dict) -> None:
    """Inject adapters (B = 0: the policy's outputs are unchanged) into the AR transformer, in place."""
    _inject(policy, lora_config(policy, options))


def _inject(policy: nn.Module, config) -> None:
    from peft import inject_adapter_in_model

    grads = {
        p: p.requires_grad for p in policy.parameters()
    }  # peft freezes everything else: leave that to the trainer
    inject_adapter_in_model(config, policy)
    for p, flag in grads.items():
        p.requires_grad_(flag)
    layers = lora_layers(policy)
    if not layers:
        raise ValueError(f"LoRA: no Linear layer of {type(policy).__name__} matches {config.target_modules!r}")
    for layer in layers:
        layer.register_state_dict_post_hook(_base_keys)
        layer.register_load_state_dict_pre_hook(_lora_keys)


def lora_layers(module: nn.Module) -> list[nn.Module]:
    """The adapted layers (empty, and peft never imported, for a module without adapters)."""
    if not hasattr(module, "peft_config"):
        return []
    from peft.tuners.lora import LoraLayer

    return [m for m in module.modules() if isinstance(m, LoraLayer)]


def adapter_parameters(module: nn.Module) -> Iterator[nn.Parameter]:
    return (p for _, p in _adapter_items(module))


def _base_keys(module, state_dict, prefix, local_metadata) -> None:
    """State-dict post-hook of an adapted layer: its base weights under their own names, no adapters."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix) :]
        if rest.startswith(_BASE):
            state_dict[prefix + rest[len(_BASE) :]] = state_dict.pop(key)
        elif rest.startswith("lora_"):
            del state_dict[key]


def _lora_keys(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors) -> None:
    """Load pre-hook: a base state dict loads into the adapted layer; absent adapter weights stay as they are."""
    for name, _ in module.base_layer.named_parameters():
        if prefix + name in state_dict:
            state_dict[prefix + _BASE + name] = state_dict.pop(prefix + name)
    for name, p in module.named_parameters():
        if name.startswith("lora_"):
            state_dict.setdefault(prefix + name, p.detach())


@contextlib.contextmanager
def adapters_disabled(module: nn.Module | None):
    """The base model for the duration (the reference policy under LoRA); a no-op without adapters."""
    layers = [] if module is None else lora_layers(module)
    grads = [(p, p.requires_grad) for p in adapter_parameters(module)] if layers else []
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield module
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for p, flag in grads:  # peft's toggle resets requires_grad: keep the trainer's choice
            p.requires_grad_(flag)


def save_adapters(policy: nn.Module, directory: str | Path) -> None:
    """adapter_model.safetensors (peft's key format: no adapter name) + adapter_config.json beside the policy,
    their sha256 in the folder's checksums.json."""
    from margrpo.infra.files import record_checksums, save_safetensors

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = {_ADAPTER_NAME.sub(r".\1.", n): p.detach().contiguous().cpu() for n, p in _adapter_items(policy)}
    save_safetensors(state, d / ADAPTER_WEIGHTS)
    policy.peft_config["default"].save_pretrained(str(d))
    record_checksums(d, [ADAPTER_WEIGHTS, ADAPTER_CONFIG])


def has_adapters(directory: str | Path) -> bool:
    return (Path(directory) / ADAPTER_CONFIG).is_file()


def load_adapters(policy: nn.Module, directory: str | Path) -> None:
    """Inject the folder's adapters (unless the policy has them already) and load their weights, strictly."""
    from peft import LoraConfig
    from safetensors.torch import load_file

    from margrpo.infra.files import verify_checksums

    d = Path(directory)
    verify_checksums(d, [ADAPTER_WEIGHTS, ADAPTER_CONFIG])
    if not lora_layers(policy):
        _inject(policy, LoraConfig.from_pretrained(str(d)))
    state = load_file(str(d / ADAPTER_WEIGHTS))
    params = {_ADAPTER_NAME.sub(r".\1.", n): p for n, p in _adapter_items(policy)}
    if state.keys() != params.keys():
        raise ValueError(
            f"{d / ADAPTER_WEIGHTS} does not match the policy's adapters (missing "
            f"{sorted(params.keys() - state.keys())[:3]}, unexpected {sorted(state.keys() - params.keys())[:3]})"
        )
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(state[name])


_ADAPTER_NAME = re.compile(r"\.(lora_[A-Za-z]+)\.default\.")


def _adapter_items(policy: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in policy.named_parameters() if ".lora_" in n]  # state_dict() hides them
