"""Reward scorers: one protocol, a name -> factory registry, and a weighted mix."""

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
