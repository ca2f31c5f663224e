"""The per-GPU memory plan of one GRPO step of the real-scale policies, computed on a CPU with fake tensors
(`margrpo plan`; the method: `margrpo.plan.command`, docs/real-scale.md "Memory plan").

Layer 8 (see margrpo/__init__.py), with `margrpo.stages` and `margrpo.cli`: the top; it runs the trainer
(grpo), builds the policies (policy) and reads the reward models' architectures; nothing imports it but the CLI
and the benchmarks.
"""
