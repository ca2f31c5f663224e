"""CLIP-family rewards (transformers): PickScore, CLIP score and the LAION aesthetic predictor."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from margrpo.rewards.real._common import (
    _check_batch,
    _check_batch_size,
    _dtype,
    _model_and_processor,
    _prepare_transformers,
    _require_file,
    _require_pretrained,
    _score_in_chunks,
    _text_max_length,
)
from margrpo.rewards.registry import register_reward


class _HFClip:
    """A transformers CLIPModel + processor: unit image and text embeddings, batched."""

    def __init__(
        self,
        reward: str,
        path,
        processor_path,
        source: str,
        processor_source: str,
        device,
        batch_size: int,
        dtype: str = "float32",
    ):
        _prepare_transformers()
        from transformers import AutoProcessor, CLIPModel

        model_dir, proc_dir = _model_and_processor(path, processor_path, reward, source, processor_source)
        self.device = torch.device(device)
        self.batch_size, self.dtype = _check_batch_size(batch_size), _dtype(dtype, reward)
        self.model = CLIPModel.from_pretrained(model_dir, local_files_only=True).eval().to(self.device, self.dtype)
        self.processor = AutoProcessor.from_pretrained(proc_dir, local_files_only=True)
        self.max_length = _text_max_length(
            self.processor.tokenizer, self.model.config.text_config.max_position_embeddings
        )

    def image_embeds(self, pil_images: list) -> Tensor:
        pixels = self.processor(images=pil_images, return_tensors="pt")["pixel_values"].to(self.device, self.dtype)
        return F.normalize(self.model.get_image_features(pixel_values=pixels).float(), dim=-1)  # [b, E]

    def text_embeds(self, prompts: list[str]) -> Tensor:
        tok = self.processor.tokenizer(
            prompts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        feats = self.model.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
        return F.normalize(feats.float(), dim=-1)  # [b, E]

    @torch.no_grad()
    def cosine(self, images: Tensor, prompts: list[str]) -> Tensor:
        """cos(image_i, prompt_i) for each pair: [B] float32 on the CPU."""
        return _score_in_chunks(
            images,
            prompts,
            self.batch_size,
            lambda pil, text: (self.image_embeds(pil) * self.text_embeds(text)).sum(-1),
        )


@register_reward("pickscore")
class PickScoreReward:
    """PickScore: exp(logit_scale) * cos(image, prompt) of the PickScore_v1 CLIP, not rescaled (about 18-24).

    `path`: the model folder (yuvalkirstain/PickScore_v1); `processor_path`: the processor folder
    (laion/CLIP-ViT-H-14-laion2B-s32B-b79K), default `path`.
    """

    def __init__(
        self,
        path: str,
        processor_path: str | None = None,
        device: str = "cpu",
        batch_size: int = 16,
        dtype: str = "float32",
    ):
        self.clip = _HFClip(
            "pickscore",
            path,
            processor_path,
            "https://huggingface.co/yuvalkirstain/PickScore_v1",
            "https://huggingface.co/laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
            device,
            batch_size,
            dtype,
        )
        self.scale = float(self.clip.model.logit_scale.detach().float().exp())

    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        _check_batch(images, prompts, metadata)
        return (self.scale * self.clip.cosine(images, prompts)).to(torch.float32)  # [B]


CLIP_SCORE_FORMS = ("cosine", "clipscore_100")


@register_reward("clipscore")
class ClipScoreReward:
    """CLIP image-text similarity.

    form "cosine" (default): the raw cosine, as T2I-CompBench's non-spatial metric (CLIP ViT-B/32);
    form "clipscore_100": 100 * max(cos, 0) (the torchmetrics CLIPScore convention).
    """

    def __init__(
        self,
        path: str,
        processor_path: str | None = None,
        form: str = "cosine",
        device: str = "cpu",
        batch_size: int = 32,
        dtype: str = "float32",
    ):
        if form not in CLIP_SCORE_FORMS:
            raise ValueError(f"Unknown form: {form!r}; expected one of {CLIP_SCORE_FORMS}")
        self.form = form
        self.clip = _HFClip(
            "clipscore",
            path,
            processor_path,
            "https://huggingface.co/openai/clip-vit-base-patch32",
            "https://huggingface.co/openai/clip-vit-base-patch32",
            device,
            batch_size,
            dtype,
        )

    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        _check_batch(images, prompts, metadata)
        cos = self.clip.cosine(images, prompts)
        return (cos if self.form == "cosine" else 100.0 * cos.clamp(min=0)).to(torch.float32)


class AestheticMLP(nn.Module):
    """The improved-aesthetic-predictor head (christophschuhmann/improved-aesthetic-predictor).

    Linear(d, 1024) - Dropout(0.2) - Linear(1024, 128) - Dropout(0.2) - Linear(128, 64) -
    Dropout(0.1) - Linear(64, 16) - Linear(16, 1), no activations, in `layers` (state-dict keys
    layers.{0,2,4,6,7}.{weight,bias}); d = 768 for CLIP ViT-L/14.
    """

    HIDDEN = (1024, 128, 64, 16)

    def __init__(self, input_size: int = 768):
        super().__init__()
        h1, h2, h3, h4 = self.HIDDEN
        self.input_size = input_size
        self.layers = nn.Sequential(
            nn.Linear(input_size, h1),
            nn.Dropout(0.2),
            nn.Linear(h1, h2),
            nn.Dropout(0.2),
            nn.Linear(h2, h3),
            nn.Dropout(0.1),
            nn.Linear(h3, h4),
            nn.Linear(h4, 1),
        )

    def forward(self, embeds: Tensor) -> Tensor:
        return self.layers(embeds)  # [B, 1]

    @classmethod
    def load(cls, path: str | Path) -> AestheticMLP:
        """From a .pth/.pt (torch.load weights_only) or .safetensors state dict; strict keys."""
        p = Path(path)
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(p))
        else:
            state = torch.load(p, map_location="cpu", weights_only=True)
            state = state.get("state_dict", state)
        if "layers.0.weight" not in state:
            raise ValueError(
                f"aesthetic: {p} is not an improved-aesthetic-predictor state dict "
                f"(no 'layers.0.weight'; keys: {sorted(state)[:6]}...)"
            )
        mlp = cls(int(state["layers.0.weight"].shape[1]))
        mlp.load_state_dict(state, strict=True)
        return mlp.eval()


@register_reward("aesthetic")
class AestheticReward:
    """LAION aesthetic score: the MLP on the L2-normalised CLIP ViT-L/14 image embedding (about 1-10).

    `path`: the MLP weights (sac+logos+ava1-l14-linearMSE.pth); `clip_path`: the CLIP folder
    (openai/clip-vit-large-patch14) holding model and image-processor files.
    """

    def __init__(self, path: str, clip_path: str, device: str = "cpu", batch_size: int = 32, dtype: str = "float32"):
        _prepare_transformers()
        from transformers import AutoConfig, AutoImageProcessor, CLIPVisionModelWithProjection

        mlp_file = _require_file(
            path,
            "aesthetic",
            "path",
            "the improved-aesthetic-predictor MLP weights (sac+logos+ava1-l14-linearMSE.pth or .safetensors)",
            "https://github.com/christophschuhmann/improved-aesthetic-predictor",
        )
        clip_dir = _require_pretrained(
            clip_path, "aesthetic", "clip_path", "https://huggingface.co/openai/clip-vit-large-patch14"
        )
        if not (clip_dir / "preprocessor_config.json").is_file():
            raise FileNotFoundError(
                f"aesthetic: {clip_dir}/preprocessor_config.json not found (the CLIP image "
                "processor); download openai/clip-vit-large-patch14 completely"
            )
        self.device = torch.device(device)
        self.batch_size, self.dtype = _check_batch_size(batch_size), _dtype(dtype, "aesthetic")
        config = AutoConfig.from_pretrained(clip_dir, local_files_only=True)
        vision_config = getattr(config, "vision_config", config)
        # a full CLIP checkpoint keeps projection_dim at the top level; the vision tower needs it
        vision_config.projection_dim = getattr(config, "projection_dim", vision_config.projection_dim)
        self.vision = (
            CLIPVisionModelWithProjection.from_pretrained(clip_dir, config=vision_config, local_files_only=True)
            .eval()
            .to(self.device, self.dtype)
        )
        self.image_processor = AutoImageProcessor.from_pretrained(clip_dir, local_files_only=True)
        self.mlp = AestheticMLP.load(mlp_file).to(self.device, self.dtype)
        if self.mlp.input_size != self.vision.config.projection_dim:
            raise ValueError(
                f"aesthetic: the MLP takes {self.mlp.input_size}-d embeddings but the CLIP at "
                f"{clip_dir} projects to {self.vision.config.projection_dim}"
            )

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        _check_batch(images, prompts, metadata)
        return _score_in_chunks(images, prompts, self.batch_size, lambda pil, _: self._score(pil))

    def _score(self, pil: list) -> Tensor:
        pixels = self.image_processor(images=pil, return_tensors="pt")["pixel_values"].to(self.device, self.dtype)
        embeds = F.normalize(self.vision(pixel_values=pixels).image_embeds.float(), dim=-1)  # [b, 768]
        return self.mlp(embeds.to(self.dtype)).squeeze(-1)  # [b]
