"""Thin stage entry points: parse arguments, call the library, write outputs atomically."""
