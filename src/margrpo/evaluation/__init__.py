"""Evaluation over a directory of samples: T2I-CompBench-style categories and preference metrics.

Submodules are imported on use (`margrpo.evaluation.toy_compbench`), so importing this package
pulls in nothing heavy.
Layer 6 (see margrpo/__init__.py): it must not import experiment, stages, plan, cli.
"""
