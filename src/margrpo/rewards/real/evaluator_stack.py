"""Rewards whose packages live only in the evaluator environment (`.venv-eval`): HPS v2.1, ImageReward.

hpsv2 and image-reward are imported in the constructors (after `_import_evaluator_package`
checks them), so this module imports without them.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor

from margrpo.rewards.real._common import (
    _check_batch,
    _check_batch_size,
    _dtype,
    _import_evaluator_package,
    _require_file,
    _score_in_chunks,
)
from margrpo.rewards.registry import register_reward


def _load_open_clip_config(clip_path: str | Path, model_name: str) -> dict:
    """An open_clip architecture config: a JSON file, or a folder holding `{model_name}.json` or
    `open_clip_config.json` (the Hugging Face layout, whose "model_cfg" is used)."""
    import json

    p = Path(clip_path).expanduser()
    candidates = [p] if p.is_file() else [p / f"{model_name}.json", p / "open_clip_config.json"]
    for c in candidates:
        if c.is_file():
            cfg = json.loads(c.read_text())
            cfg = cfg.get("model_cfg", cfg)
            if not all(k in cfg for k in ("embed_dim", "vision_cfg", "text_cfg")):
                raise ValueError(
                    f"hpsv2: {c} is not an open_clip model config (needs embed_dim, vision_cfg, text_cfg)"
                )
            return cfg
    raise FileNotFoundError(
        f"hpsv2: {p} not found (expected an open_clip model config: a JSON file, or a folder with "
        f"{model_name}.json or open_clip_config.json, e.g. laion/CLIP-ViT-H-14-laion2B-s32B-b79K); "
        f"point reward_models.hpsv2.clip_path at it, or leave it out to use hpsv2's bundled {model_name} config"
    )


@register_reward("hpsv2")
class HPSv2Reward:
    """HPS v2.1: cos(image, prompt) of the HPS-fine-tuned open_clip ViT-H-14 (hpsv2's `score`; about 0.2-0.35).

    The model is built by hpsv2's own open_clip with pretrained=None (no download) and loaded
    strictly from `path` (HPS_v2.1_compressed.pt, {"state_dict": ...}, torch.load weights_only);
    the tokenizer is hpsv2's bundled BPE. The architecture is hpsv2's bundled `model_name` config,
    or the open_clip config at `clip_path` when given (the HPS checkpoint holds every weight, so no
    base CLIP weights are read). Preprocessing: hpsv2's evaluation transform (resize the longer
    side, pad, normalise).
    """

    def __init__(
        self,
        path: str,
        clip_path: str | None = None,
        model_name: str = "ViT-H-14",
        device: str = "cpu",
        batch_size: int = 16,
        dtype: str = "float32",
    ):
        ckpt = _require_file(
            path,
            "hpsv2",
            "path",
            "the HPS v2.1 checkpoint HPS_v2.1_compressed.pt",
            "https://huggingface.co/xswu/HPSv2",
        )
        cfg = _load_open_clip_config(clip_path, model_name) if clip_path is not None else None
        _import_evaluator_package("hpsv2", "hpsv2.src.open_clip", "hpsv2")
        from hpsv2.src.open_clip import create_model_and_transforms, factory, get_tokenizer

        if cfg is not None:
            # hpsv2's open_clip looks architectures up by name in this registry (filled from JSON files)
            factory._MODEL_CONFIGS[model_name] = cfg
        elif factory.get_model_config(model_name) is None:
            raise ValueError(f"hpsv2: unknown model_name {model_name!r}; give clip_path (an open_clip config)")
        self.device = torch.device(device)
        self.batch_size = _check_batch_size(batch_size)
        self.model, _, self.preprocess = create_model_and_transforms(
            model_name,
            pretrained=None,
            precision="fp32",
            device=self.device,
            jit=False,
            force_quick_gelu=False,
            force_custom_text=False,
            force_patch_dropout=False,
            force_image_size=None,
            pretrained_image=False,
            image_mean=None,
            image_std=None,
            light_augmentation=True,
            aug_cfg={},
            output_dict=True,
            with_score_predictor=False,
            with_region_predictor=False,
        )
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state)
        if next(iter(state)).startswith("module."):
            state = {k[len("module.") :]: v for k, v in state.items()}
        self.model.load_state_dict(state, strict=True)
        self.dtype = _dtype(dtype, "hpsv2")
        self.model.eval().to(self.dtype)
        self.tokenizer = get_tokenizer(model_name)

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        _check_batch(images, prompts, metadata)
        return _score_in_chunks(images, prompts, self.batch_size, self._score)

    def _score(self, pil: list, prompts: list[str]) -> Tensor:
        pixels = torch.stack([self.preprocess(im) for im in pil]).to(self.device, self.dtype)
        img = self.model.encode_image(pixels, normalize=True).float()
        txt = self.model.encode_text(self.tokenizer(prompts).to(self.device), normalize=True).float()
        return (img * txt).sum(-1)


@contextmanager
def _bert_base_uncased_from(folder: str | None):
    """While loading ImageReward, answer its BLIP's hub-name request for 'bert-base-uncased' from `folder`."""
    if folder is None:
        yield
        return
    import ImageReward.models.BLIP.blip as blip

    original = blip.BertTokenizer

    class LocalBertTokenizer(original):
        @classmethod
        def from_pretrained(cls, name, *args, **kwargs):
            return original.from_pretrained(str(folder) if name == "bert-base-uncased" else name, *args, **kwargs)

    blip.BertTokenizer = LocalBertTokenizer
    try:
        yield
    finally:
        blip.BertTokenizer = original


@register_reward("imagereward")
class ImageRewardReward:
    """ImageReward-v1.0: (MLP(BLIP [CLS] of the prompt cross-attending the image) - mean) / std.

    Loaded with the package's own `ImageReward.load(path, device, med_config=...)` from local
    files (ImageReward.pt and med_config.json of THUDM/ImageReward). The package's BLIP asks for
    the `bert-base-uncased` tokenizer by hub name: `tokenizer_path` (a local folder with its
    vocab.txt) answers that request, for compute nodes with no hub cache; without it the Hugging
    Face cache must hold the tokenizer. Scoring is batched through the model's `score_gard`
    (prompt tokens padded to 35, as `score`).
    """

    def __init__(
        self,
        path: str,
        med_config: str,
        device: str = "cpu",
        batch_size: int = 16,
        tokenizer_path: str | None = None,
        dtype: str = "float32",
    ):
        source = "https://huggingface.co/THUDM/ImageReward"
        ckpt = _require_file(path, "imagereward", "path", "the ImageReward checkpoint ImageReward.pt", source)
        med = _require_file(med_config, "imagereward", "med_config", "the BLIP text config med_config.json", source)
        if tokenizer_path is not None:
            _require_file(
                Path(tokenizer_path) / "vocab.txt",
                "imagereward",
                "tokenizer_path",
                "the vocab.txt of a bert-base-uncased tokenizer folder",
                "https://huggingface.co/bert-base-uncased",
            )
        _import_evaluator_package("imagereward", "ImageReward", "image-reward")
        import ImageReward as RM

        self.device = torch.device(device)
        self.batch_size = _check_batch_size(batch_size)
        with _bert_base_uncased_from(tokenizer_path):
            self.model = RM.load(str(ckpt), device=str(self.device), med_config=str(med)).eval()
        self.dtype = _dtype(dtype, "imagereward")
        self.model.to(self.dtype)

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        _check_batch(images, prompts, metadata)
        return _score_in_chunks(images, prompts, self.batch_size, self._score)

    def _score(self, pil: list, prompts: list[str]) -> Tensor:
        pixels = torch.stack([self.model.preprocess(im) for im in pil]).to(self.device, self.dtype)
        text = self.model.blip.tokenizer(
            prompts, padding="max_length", truncation=True, max_length=35, return_tensors="pt"
        ).to(self.device)
        return self.model.score_gard(text.input_ids, text.attention_mask, pixels).squeeze(-1)  # [b]
