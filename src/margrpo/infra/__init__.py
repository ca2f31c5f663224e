"""Plumbing every part uses: atomic files and manifests (`files`), the machine and schedule of a training loop
(`runtime`), the weights' moving average (`ema`), the experiment trackers (`trackers`), the single-node launcher
(`launch`), strict readers of JSON entries (`readers`), import workarounds (`compat`).
Layer 0 (see margrpo/__init__.py): it must not import any other margrpo package.
"""
