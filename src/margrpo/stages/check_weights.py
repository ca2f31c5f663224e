"""`margrpo check-weights`: a real-scale weights folder exists and has the expected files.

The folder is a local path or a Hugging Face repository id (`owner/name[@revision]`) resolved offline from the
local Hugging Face cache, by the same code the loaders and `margrpo weights` use (`margrpo.infra.weights`).
Writes a small pointer (policy.json, naming the resolved folder) instead of copying gigabytes; stages load through it.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

log = logging.getLogger(__name__)

# Files each kind of checkpoint folder must hold (diffusers-style layout for NOVA, Harmon's release layout).
EXPECTED = {
    "nova": [
        "model_index.json",
        "transformer/config.json",
        "vae/config.json",
        "text_encoder/config.json",
        "tokenizer",
    ],
    "harmon": [
        "harmon_1.5b.pth",
        "kl16.ckpt",
        "Qwen2.5-1.5B-Instruct/config.json",
        "Qwen2.5-1.5B-Instruct/tokenizer.json",
    ],
    "toy": ["config.json", "model.safetensors", "tokenizer"],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kind", required=True, choices=sorted(EXPECTED))
    p.add_argument("--path", required=True, help="a local folder or a Hugging Face repository id (owner/name[@rev])")
    p.add_argument("--out", required=True)


def check_folder(kind: str, path: str | Path) -> Path:
    """The folder, if it holds every expected file: non-empty, `.json` ones valid JSON objects."""
    from margrpo.infra.files import InputError, read_json
    from margrpo.infra.weights import HARMON_HF_LAYOUT, missing_files, resolve_weights

    p = resolve_weights(path).expanduser().resolve()
    if not p.is_dir():
        raise FileNotFoundError(
            f"{kind} weights: folder {p} does not exist; put the checkpoint there (expected files: "
            f"{', '.join(EXPECTED[kind])}) or set policies.<name>.path (`margrpo weights --config ...` lists them)"
        )
    if kind == "harmon" and _is_transformers_format(p):  # the wusize/Harmon-1_5B folder (policy.harmon_files)
        if missing := missing_files(p, HARMON_HF_LAYOUT):
            raise FileNotFoundError(f"{kind} weights in {p}: missing {', '.join(missing)}")
        return p
    missing = [f for f in EXPECTED[kind] if not (p / f).exists()]
    if missing:
        raise FileNotFoundError(
            f"{kind} weights in {p}: missing {', '.join(missing)} (expected: {', '.join(EXPECTED[kind])})"
        )
    for name in EXPECTED[kind]:
        f = p / name
        if (f.is_dir() and not any(f.iterdir())) or (f.is_file() and f.stat().st_size == 0):
            raise InputError(f"{kind} weights: {f} is empty")
        if f.suffix == ".json" and not isinstance(read_json(f), dict):
            raise InputError(f"{kind} weights: {f} is not a JSON object")
    return p


def _is_transformers_format(p: Path) -> bool:
    import json

    try:
        raw = json.loads((p / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(raw, dict) and "mar" in raw and "llm" in raw


def run(args) -> None:
    from margrpo.infra.files import atomic_write_json
    from margrpo.stages._common import write_spec

    p = check_folder(args.kind, args.path)
    write_spec(Path(args.out).parent, {"kind": args.kind, "path": str(p)})
    atomic_write_json(args.out, {"kind": args.kind, "path": str(p)})
    log.info(f"{args.kind} weights found at {p}")
