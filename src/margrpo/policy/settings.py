"""How RL holds a policy (config `policies.<name>`): the parameters it leaves frozen, the memory levers
(gradient checkpointing, LoRA) and how several processes split it. They belong to the policy, not to the GRPO
algorithm: one GRPO variant runs on every policy with that policy's own settings."""

from __future__ import annotations

from dataclasses import dataclass, fields

# how a run of several processes splits the policy (grpo.parallel): DDP, or FSDP2 as ZeRO-3, ZeRO-2, or HSDP
SHARDINGS = ("replicate", "full_shard", "shard_grad_op", "hybrid_shard")


@dataclass
class PolicySettings:
    """A policy's RL settings, as `margrpo train` receives them (`experiment.specs.train_spec`: the config's
    `rl_frozen` is `frozen` here)."""

    # parameter-name prefixes RL leaves frozen besides the encoders (no gradient, no optimizer state, shared with
    # the KL reference); MAR-GRPO's Harmon runs train mar.* only: ("llm.", "proj_in.", "proj_out.")
    frozen: tuple[str, ...] = ()
    gradient_checkpointing: bool = False  # recompute the AR and head blocks' activations in backward
    # LoRA {rank, alpha, dropout, target_modules} on the AR transformer (policy.lora): RL then trains the
    # adapters alone and replays the KL reference as the same model with the adapters disabled
    lora: dict | None = None
    # several processes only; no effect on results but the summation order (one autocast for every sharding:
    # docs/real-scale.md, "Mixed precision, once")
    sharding: str = "replicate"

    def __post_init__(self):
        self.frozen = tuple(self.frozen)  # from JSON: a list
        if self.sharding not in SHARDINGS:
            raise ValueError(f"sharding must be one of {', '.join(SHARDINGS)}, got {self.sharding!r}")

    @classmethod
    def from_spec(cls, spec: dict) -> PolicySettings:
        """From a train spec's `policy` section (absent: every setting at its default)."""
        section = spec.get("policy") or {}
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - names)
        if unknown:
            raise ValueError(f"unknown policy setting(s) {unknown}; expected names from {', '.join(sorted(names))}")
        return cls(**section)
