"""The related methods of Table 3, one package each, beside the MAR-GRPO core they are compared with:
`maskgrpo` (GRPO and MaskGRPO on a discrete masked-token toy policy) and `marval` (a one-step
distilled MAR and reward-gradient RL on it).
Layer 5 (see margrpo/__init__.py): it must not import evaluation, reporting, experiment, stages, plan, cli.
"""
