"""A GRPO run's settings, checked in one place and handed on as typed objects.

`margrpo train` receives a train spec (`experiment.specs.train_spec`: what Snakemake passes, or built by hand
from a config). `train_settings` checks it once, every error naming its key path: the schema section by section,
the policy's settings, the batch against the number of processes and the policy's sampling, the validation
prompts against the suite. What it returns (`TrainSettings`) is what the trainer and the engine take as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from margrpo.experiment.config_checks import check_grpo_run, check_val_prompts
from margrpo.experiment.schema import ConfigError
from margrpo.experiment.specs import validate_train_spec
from margrpo.grpo.config import GRPOConfig, check_policy_settings
from margrpo.grpo.rollout import SamplingConfig
from margrpo.policy.settings import PolicySettings


@dataclass
class TrainSettings:
    spec: dict  # the checked spec, with the schema's defaults: what spec.json records and the run hash reads
    grpo: GRPOConfig
    policy: PolicySettings
    sampling: SamplingConfig

    @property
    def reward_weights(self) -> dict[str, float]:
        return self.spec["reward"]["weights"]

    @property
    def reward_models(self) -> dict:
        return self.spec.get("reward_models", {})


def train_settings(
    spec: dict, what: str, processes: int, val_size: int, val_from: str | Path, key=None
) -> TrainSettings:
    """`spec` checked and typed. `what` names its source in errors (`--spec-json`, a config file); `key(k)` the
    key path of GRPO setting k there (default `grpo.k`); `val_size`: the prompts of the validation suite
    `val_from`."""
    key = key or (lambda k: f"grpo.{k}")
    spec = validate_train_spec(spec, what)
    check_grpo_run(spec["grpo"], {"sampling": spec["sampling"]}, processes, what, key)
    check_val_prompts(spec["grpo"]["val_prompts"], val_size, str(val_from), what, key("val_prompts"))
    try:
        grpo = GRPOConfig.from_spec(spec, precision=spec.get("mixed_precision", "bf16"))
        policy = PolicySettings.from_spec(spec)
        check_policy_settings(grpo, policy)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{what}: {err}") from None
    return TrainSettings(spec, grpo, policy, SamplingConfig(**spec["sampling"]))
