"""MAR-GRPO: stabilized GRPO for AR-diffusion hybrid image generators."""
__version__ = "0.1.0"
