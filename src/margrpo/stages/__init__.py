"""Thin stage entry points: parse arguments, call the library, write outputs atomically.

Layer 8 (see margrpo/__init__.py), with `margrpo.cli`: the top; nothing imports a stage but the CLI.
"""
