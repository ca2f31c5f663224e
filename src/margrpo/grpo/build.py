"""What a GRPO run is built from before its first step (the trainer's builder): which parameters RL trains, the KL
reference, the engine around both, the gradient statistics' parameters and probe, the optimizer and the
checkpointer. The trainer (grpo.trainer) only steps them."""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from margrpo.grpo.checkpoints import Checkpointer
from margrpo.grpo.config import GRPOConfig, check_policy_settings
from margrpo.grpo.engine import Engine
from margrpo.grpo.grad_stats import GradVarianceProbe, NoProbe
from margrpo.grpo.parallel import parallelize
from margrpo.infra.ema import EMA
from margrpo.policy.base import MARPolicy
from margrpo.policy.lora import adapter_parameters, add_lora
from margrpo.policy.settings import PolicySettings

log = logging.getLogger("margrpo.grpo.trainer")


@dataclass
class TrainerParts:
    engine: Engine  # processes, devices, autocast, the gradient's reduction and norm
    ref: MARPolicy | None  # the KL reference (None at beta = 0; the policy itself under LoRA)
    params: list[nn.Parameter]  # what the optimizer steps
    stat_params: list[nn.Parameter]  # the AR's (the head's with the AR frozen): Fig. 2a / 5's gradient statistics
    probe: GradVarianceProbe | NoProbe
    optimizer: torch.optim.Optimizer
    checkpointer: Checkpointer
    groups: range  # the prompt groups of each batch this process rolls out (data parallel)
    ema: EMA | None  # the average of the trained parameters (grpo.ema_decay), updated after every optimizer step


def build_parts(
    policy: MARPolicy, config: GRPOConfig, settings: PolicySettings, device: torch.device, state_dir: Path
) -> TrainerParts:
    """The run's parts around `policy`, in the order that matters: the memory levers and the trained parameters
    first, then the reference (sharing what RL never changes), then the engine (FSDP replaces the parameters by
    shards, so everything read from them comes after)."""
    choose_trained(policy, config, settings)
    ref = reference(policy, config, settings)
    engine = parallelize(policy, settings, config.precision, list(policy.head_parameters()), device, reference=ref)
    part = policy.head_parameters() if config.freeze_ar else policy.ar_parameters()
    stat_params = [p for p in part if p.requires_grad]
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.999), weight_decay=config.weight_decay)
    checkpointer = Checkpointer(policy, optimizer, engine, state_dir, lora=bool(settings.lora))
    groups = engine.prompt_groups(config.batch_prompts)
    if (len(groups) * config.group_size) % config.micro_batches:
        raise ValueError(
            f"micro_batches ({config.micro_batches}) must divide the {len(groups) * config.group_size} "
            "images each process rolls out"
        )
    ema = None
    if config.ema_decay is not None:
        ema = EMA(policy, config.ema_decay, [n for n, p in policy.named_parameters() if p.requires_grad])
        optimizer.register_step_post_hook(lambda *_: ema.update(policy))
        checkpointer.ema = ema
    gradient_probe = probe(stat_params, config, engine)
    return TrainerParts(engine, ref, params, stat_params, gradient_probe, optimizer, checkpointer, groups, ema)


def choose_trained(policy: MARPolicy, config: GRPOConfig, settings: PolicySettings) -> None:
    """The memory levers the policy takes (checkpointing, LoRA), then which parameters RL trains: the rest get no
    gradient and no optimizer state (frozen encoders, the head under +Fix, the AR under `head`, `frozen`)."""
    check_policy_settings(config, settings)
    if settings.gradient_checkpointing:
        policy.set_gradient_checkpointing(True)
    if settings.lora:
        add_lora(policy, settings.lora)
    head = set(map(id, policy.head_parameters()))
    trained = (set() if config.freeze_ar else set(map(id, policy.ar_parameters()))) | (
        set() if config.freeze_head else head
    )
    if settings.lora:  # the adapters alone
        trained = set(map(id, adapter_parameters(policy)))
    names = [n for n, _ in policy.named_parameters()]
    for prefix in settings.frozen:
        if not any(n.startswith(prefix) for n in names):
            raise ValueError(
                f"frozen: no parameter name of {type(policy).__name__} starts with {prefix!r} "
                f"(top-level modules: {sorted({n.split('.')[0] for n in names})})"
            )
    trained -= {id(p) for n, p in policy.named_parameters() if n.startswith(settings.frozen)}
    for p in policy.parameters():
        if id(p) not in trained:
            p.requires_grad_(False)


def reference(policy: MARPolicy, config: GRPOConfig, settings: PolicySettings) -> MARPolicy | None:
    """The KL reference: none at beta = 0; under LoRA the policy itself, replayed with its adapters disabled; else a
    frozen copy of the pre-RL policy that shares (does not copy) what RL never changes."""
    if config.beta <= 0:
        return None
    if settings.lora:
        return policy
    shared = {id(p): p for p in policy.parameters() if not p.requires_grad}  # deepcopy's memo
    return copy.deepcopy(policy, shared).requires_grad_(False).eval()


def probe(stat_params: list[nn.Parameter], config: GRPOConfig, engine: Engine) -> GradVarianceProbe | NoProbe:
    """The gradient-variance probe, where it is asked for and can be taken (two micro-batches or more; a null probe
    otherwise), for the engine's reduction: under FSDP `.grad` shows each micro-batch's sum over the processes
    (`rounds`); under DDP the probe reads the local gradients in the engine's hook before they are reduced."""
    if not config.grad_variance:
        return NoProbe()
    try:
        variance = GradVarianceProbe(stat_params, config.micro_batches, engine, engine.reduces_each_micro_batch)
    except ValueError as err:
        log.warning("%s: logging no grad_var_ar", err)
        return NoProbe()
    engine.observe_local_gradients(stat_params, variance.observe_local)
    return variance
