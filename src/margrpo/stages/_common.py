"""Small helpers shared by the stage entry points (argument parsing, devices, suites, rewards)."""

from __future__ import annotations

import json
import os
from pathlib import Path



def setup(threads: int | None, device: str = "auto"):
    """Thread count for CPU jobs (Snakemake runs several in parallel) and the device to use."""
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if threads:
        torch.set_num_threads(threads)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the config asks for device: cuda, but no CUDA device is visible; set device: cpu or auto")
    return torch.device(device)


def json_arg(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"{what}: not valid JSON ({err})") from err
    if not isinstance(value, dict):
        raise SystemExit(f"{what}: expected a JSON object")
    return value


def sampling_config(d: dict):
    """SamplingConfig from a config's `sampling` section (every field it knows; other keys ignored)."""
    import dataclasses

    from margrpo.rollout import SamplingConfig

    names = {f.name for f in dataclasses.fields(SamplingConfig)}
    return SamplingConfig(**{k: v for k, v in d.items() if k in names})


def prompt_set(path: str | Path):
    """A suite file as a PromptSet (prompts + per-prompt metadata: category and spec)."""
    from margrpo.grpo.trainer import PromptSet
    from margrpo.world import load_suite

    records = load_suite(path)
    return PromptSet([r.prompt for r in records], [{"category": r.category, "spec": r.spec} for r in records])


def reward_options(weights: dict, reward_models: dict, toyclip_dir: str | None) -> dict:
    """Per-scorer constructor options: local weight paths from the config; the toy model from the pipeline."""
    options = {name: dict(reward_models.get(name, {})) for name in weights}
    if "toyclip" in weights:
        options["toyclip"] = {"path": toyclip_dir, **options["toyclip"]}
    return {k: v for k, v in options.items() if v}
