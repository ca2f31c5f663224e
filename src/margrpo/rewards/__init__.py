"""Reward scorers: one protocol, a name -> factory registry, and a weighted mix.

Layer 3 (see margrpo/__init__.py): it must not import grpo, toylab, related, evaluation, reporting,
experiment, stages, plan, cli.
"""

from margrpo.rewards import real as _real  # noqa: F401,E402  (registers the real-scale scorers; imports models lazily)
from margrpo.rewards.registry import (
    RewardFunction,
    RewardMix,
    available_rewards,
    build_reward,
    build_reward_mix,
    check_scores,
    register_reward,
)

__all__ = [
    "RewardFunction",
    "RewardMix",
    "available_rewards",
    "build_reward",
    "build_reward_mix",
    "check_scores",
    "register_reward",
]
