"""Prompts, independent of where they come from: the suite record and its files, and prompt analysis.

The toy world (`margrpo.world`) builds its own suites and the real-scale loaders read prompt files;
both hand their records to this package's reader and writer, and rewards read prompts through it.
Layer 2 (see margrpo/__init__.py): it must not import rewards, grpo, toylab, related, evaluation, reporting,
experiment, stages, plan, cli.
"""
