"""What every real-scale scorer shares: local weight files (never downloaded) and batch checks.

A missing or incomplete path raises FileNotFoundError naming the files expected and where to get
them; evaluator-stack packages (hpsv2, image-reward) fail with an ImportError saying how to install.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

EVALUATOR_HINT = "install the evaluator stack: make evaluators (or envs/evaluators.yaml)"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
PROCESSOR_FILES = ("preprocessor_config.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")


# ============================================================================ local files


def _require_file(path: str | Path | None, reward: str, option: str, expected: str, source: str) -> Path:
    """`path` as a Path if it is a file; else FileNotFoundError naming the file and where to get it."""
    if path is None:
        raise ValueError(f"{reward}: option {option!r} is required ({expected}; from {source})")
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(
            f"{reward}: {p} not found (expected {expected}); download it from {source} "
            f"and point reward_models.{reward}.{option} at it"
        )
    return p


def _require_pretrained(path: str | Path | None, reward: str, option: str, source: str, kind: str = "model") -> Path:
    """A folder written by `save_pretrained`: config.json + weights ("model") or processor files. `path` may name a
    Hugging Face repository id (`owner/name[@revision]`), read from the local cache (infra.weights; never fetched)."""
    from margrpo.infra.weights import resolve_weights

    if path is None:
        raise ValueError(f"{reward}: option {option!r} is required (a local {kind} folder; from {source})")
    try:
        p = resolve_weights(path)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{reward}: reward_models.{reward}.{option}: {err}") from None
    if kind == "model":
        need, any_of = ("config.json",), WEIGHT_FILES
    else:  # processor: image preprocessing config + a tokenizer
        need, any_of = PROCESSOR_FILES, TOKENIZER_FILES
    missing = [f for f in need if not (p / f).is_file()]
    if not p.is_dir() or missing or not any((p / f).is_file() for f in any_of):
        expected = " + ".join(need) + " and one of " + " / ".join(any_of)
        raise FileNotFoundError(
            f"{reward}: {p} not found or incomplete (expected a {kind} folder with {expected}, as written by "
            f"save_pretrained); download {source} into it and point reward_models.{reward}.{option} at it"
        )
    return p


def _model_and_processor(
    path, processor_path, reward: str, source: str, processor_source: str | None = None
) -> tuple[Path, Path]:
    """The model folder (`path`) and its processor folder (`processor_path`, default: the model's)."""
    model_dir = _require_pretrained(path, reward, "path", source)
    proc_dir = _require_pretrained(
        processor_path or path,
        reward,
        "processor_path" if processor_path else "path",
        processor_source or source,
        kind="processor",
    )
    return model_dir, proc_dir


def _prepare_transformers() -> None:
    """transformers' image processors import torchvision when it is installed; in the evaluator
    environment that is the CUDA build, which needs the CPU-torch workaround first (margrpo.infra.compat)."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        from margrpo.infra.compat import ensure_torchvision_importable

        ensure_torchvision_importable()


def _import_evaluator_package(reward: str, module: str, package: str) -> None:
    """Import `module` (of pip package `package`), or raise an ImportError saying how to install it."""
    from margrpo.infra.compat import ensure_torchvision_importable

    ensure_torchvision_importable()  # both packages import torchvision (CPU torch + its CUDA build)
    try:
        __import__(module)
    except ImportError as err:
        raise ImportError(
            f"{reward}: the {package!r} package is not importable here ({err}); {EVALUATOR_HINT}, "
            f"and run with .venv-eval/bin/python"
        ) from err


# ============================================================================ batching helpers


def _check_batch(images: Tensor, prompts: Sequence[str], metadata: Sequence[dict] | None) -> list[dict]:
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [B, 3, H, W] in [0, 1], got shape {tuple(images.shape)}")
    if len(prompts) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
    metadata = list(metadata) if metadata is not None else [{} for _ in prompts]
    if len(metadata) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(metadata)} metadata entries")
    return [m or {} for m in metadata]


def _to_pil(images: Tensor) -> list:
    """[B, 3, H, W] float in [0, 1] -> B PIL RGB images (8-bit, as a saved PNG)."""
    from PIL import Image

    pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)  # [B, 3, H, W]
    array = pixels.permute(0, 2, 3, 1).cpu().numpy()  # [B, H, W, 3]
    return [Image.fromarray(a) for a in array]


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def _score_in_chunks(images: Tensor, prompts: Sequence[str], batch_size: int, score) -> Tensor:
    """`score(pil_images, prompts)` -> [b] over chunks of `batch_size` 8-bit images: [B] float32 on the CPU."""
    pil = _to_pil(images)
    out = [score(pil[s], list(prompts[s])).float().cpu() for s in _chunks(len(pil), batch_size)]
    return torch.cat(out).to(torch.float32)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str, reward: str) -> torch.dtype:
    """A scorer's model dtype (`reward_models.<name>.dtype`): half precision halves its memory; inputs
    are cast to it and scores come back as float32 whatever it is."""
    if name not in DTYPES:
        raise ValueError(f"{reward}: unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _check_batch_size(batch_size: int) -> int:
    if int(batch_size) < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    return int(batch_size)


def _text_max_length(tokenizer, config_max: int) -> int:
    """Truncation length: the tokenizer's limit, capped by the model's position table."""
    limit = getattr(tokenizer, "model_max_length", None) or config_max
    return int(min(limit, config_max))
