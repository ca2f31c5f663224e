"""GRPO for MAR policies: advantages, policy loss, KL, MTE and Sim masks (pure functions)."""

from margrpo.grpo.functions import (
    consistency_mask,
    group_advantages,
    kl_gaussian,
    kl_paper,
    masked_mean,
    mte_loss,
    per_token_policy_objective,
    policy_loss,
    policy_ratio_stats,
    uncertainty_mask,
)

__all__ = [
    "consistency_mask",
    "group_advantages",
    "kl_gaussian",
    "kl_paper",
    "masked_mean",
    "mte_loss",
    "per_token_policy_objective",
    "policy_loss",
    "policy_ratio_stats",
    "uncertainty_mask",
]
