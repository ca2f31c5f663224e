"""Distillation of the MAR diffusion head into a one-step generator (MARVAL) and reward-gradient RL on it.

`one_step`: the one-step policy and its differentiable generation loop; `distill`: the score-based
variational distillation against the teacher's CFG predictions; `rl`: MARVAL-RL, reward
gradients through the one-step generator. Its sampler is `margrpo.diffusion.OneStepSampler`, beside the
others. The one-step policy is a plain `ToyMAR` folder (`head_sampler: one_step`), so the GRPO trainer and
rollout run on it unchanged.
Layer 5 (see margrpo/__init__.py): it must not import evaluation, reporting, experiment, stages, cli.
"""

from margrpo.related.marval.distill import MARVALConfig, MARVALDistiller, generator_loss, teacher_distance, teacher_ode
from margrpo.related.marval.one_step import OneStepRollout, committed_log_prob, generate_one_step, one_step_policy
from margrpo.related.marval.rl import MARVALRL, MARVALRLConfig

__all__ = [
    "MARVALConfig",
    "MARVALDistiller",
    "MARVALRL",
    "MARVALRLConfig",
    "OneStepRollout",
    "committed_log_prob",
    "generate_one_step",
    "generator_loss",
    "one_step_policy",
    "teacher_distance",
    "teacher_ode",
]
