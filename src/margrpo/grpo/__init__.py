"""MAR-GRPO's core: the rollout that records every transition with its exact log-probability (`rollout`),
the loss pieces as pure functions (`objective`: advantages, policy loss, KL, MTE and Sim masks), and the one
trainer every policy plugs into (`trainer`, with its `config`, seeded `random_streams` and `run_files`, the folder
every RL run writes).

Layer 4 (see margrpo/__init__.py): it must not import toylab, related, evaluation, reporting, experiment, stages,
plan, cli.
"""

from margrpo.grpo.objective import (
    consistency_mask,
    group_advantages,
    kl_gaussian,
    kl_paper,
    masked_mean,
    mte_loss,
    per_token_policy_objective,
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
    "policy_ratio_stats",
    "uncertainty_mask",
]
