"""MaskGRPO and plain GRPO on a discrete masked-token toy policy (MaskGIT-style): the policy (`policy`),
its sampler and exact token log-probabilities (`rollout`), its pre-training on ShapesWorld
(`pretraining`) and its GRPO step, loss and validation (`trainer`).
Layer 5 (see margrpo/__init__.py): it must not import evaluation, reporting, experiment, stages, cli.
"""
