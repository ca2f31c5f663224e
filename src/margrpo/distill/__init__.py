"""Distillation of the MAR diffusion head into a one-step generator (MARVAL) and reward-gradient RL on it.

`one_step`: the one-step policy and its differentiable generation loop; `marval`: the score-based
variational distillation against the teacher's CFG predictions; `marval_rl`: MARVAL-RL, reward
gradients through the one-step generator. The one-step policy is a plain `ToyMAR` folder
(`head_sampler: one_step`), so the GRPO trainer and rollout run on it unchanged.
"""

from margrpo.distill.marval import MARVALConfig, MARVALDistiller, generator_loss, teacher_distance, teacher_ode
from margrpo.distill.marval_rl import MARVALRL, MARVALRLConfig
from margrpo.distill.one_step import OneStepRollout, committed_log_prob, generate_one_step, one_step_policy

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
