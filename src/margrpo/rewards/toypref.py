"""toypref: the toy world's learned preference reward, the analogue of HPS (design.md §4).

HPS v2 is CLIP fine-tuned on human choices between two images of one prompt: people prefer the image that follows the
prompt, and at equal fidelity the better-looking one, so HPS rewards aesthetics as well as alignment. toypref is the
same recipe at toy scale: toyclip (the CLIP analogue) fine-tuned with a Bradley-Terry loss on synthetic choices that
prefer the better aligned image and, between two images of one scene, the one on the brighter backdrop (the world's
aesthetic, `WorldConfig.backdrop_range`, which no prompt names):

    score(image, prompt) = alignment_scale * cos(image, prompt) + aesthetic(image)

`aesthetic` is a small CNN without normalisation: toyclip's image tower normalises every stage (GroupNorm), which
removes most of a uniform backdrop, so a tower of its own is needed to see the look of an image (the LAION aesthetic
predictor likewise puts an MLP beside CLIP's features). Training: `margrpo.toylab.toypref_training`.

Learned, hence hackable, like HPS: its aesthetic was fitted on backdrops from black to the world's brightest; a policy
can push the backdrop past anything rendered in training (the parser stops finding objects above ~0.3 of the range,
benchmarks/parser_accuracy.py), or brighten anything else the aesthetic tower has learned to like. The exact measure
`margrpo.world.scene.backdrop_level` and the parser's scores tell a real gain from a hacked one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from margrpo.policy.text import WordTokenizer
from margrpo.rewards.toyclip import (
    ToyClip,
    ToyClipConfig,
    ToyClipReward,
    build_checked,
    load_checked,
    read_folder,
    save_folder,
)

__all__ = ["ToyPrefConfig", "ToyPref", "ToyPrefReward"]

MODEL_TYPE = "toypref"


@dataclass
class ToyPrefConfig:
    """The fine-tuned toyclip's sizes plus the aesthetic tower's."""

    clip: ToyClipConfig = field(default_factory=ToyClipConfig)
    aesthetic_width: int = 32  # channels of the aesthetic tower
    alignment_scale_init: float = 10.0  # cos differences of a one-attribute swap are ~0.1: start them near one logit

    @classmethod
    def from_dict(cls, raw: dict) -> ToyPrefConfig:
        return cls(**{**raw, "clip": ToyClipConfig(**raw.get("clip", {}))})


class AestheticTower(nn.Module):
    """[B, 3, s, s] in [0, 1] -> [B]: patchify convs (4 x 4, stride 4, twice), SiLU, average pool, linear. No
    normalisation, so the absolute brightness of every patch, backdrop included, reaches the score."""

    def __init__(self, width: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, width // 2, 4, stride=4), nn.SiLU(), nn.Conv2d(width // 2, width, 4, stride=4), nn.SiLU()
        )
        self.out = nn.Linear(width, 1)

    def forward(self, images: Tensor) -> Tensor:
        return self.out(self.net(images).mean(dim=(2, 3))).squeeze(-1)  # [B]


class ToyPref(nn.Module):
    """score = alignment_scale * cos(image, prompt) + aesthetic(image); `components` returns both terms."""

    def __init__(self, config: ToyPrefConfig, tokenizer: WordTokenizer | None = None):
        super().__init__()
        self.config = config
        self.clip = ToyClip(config.clip, tokenizer)
        self.aesthetic = AestheticTower(config.aesthetic_width)
        self.alignment_scale = nn.Parameter(torch.tensor(float(config.alignment_scale_init)))

    @classmethod
    def from_toyclip(cls, clip: ToyClip, aesthetic_width: int = 32) -> ToyPref:
        """A preference model whose alignment term starts as `clip` (HPS starts from CLIP)."""
        model = cls(ToyPrefConfig(clip=clip.config, aesthetic_width=aesthetic_width), clip.tokenizer)
        model.clip.load_state_dict(clip.state_dict())
        return model.to(clip.device)

    @property
    def device(self) -> torch.device:
        return self.alignment_scale.device

    def components(self, images: Tensor, prompts: list[str]) -> tuple[Tensor, Tensor]:
        """(alignment [B] = scale * cosine, aesthetic [B]), differentiable; images [B, 3, H, W] in [0, 1]."""
        cos = (self.clip.encode_images(images) * self.clip.encode_text(prompts)).sum(-1)
        s = self.clip.config.image_size
        if images.shape[-2:] != (s, s):
            images = nn.functional.interpolate(
                images, size=(s, s), mode="bilinear", antialias=True, align_corners=False
            )
        return self.alignment_scale * cos, self.aesthetic(images).float()

    def forward(self, images: Tensor, prompts: list[str]) -> Tensor:
        alignment, aesthetic = self.components(images, prompts)
        return alignment + aesthetic  # [B]

    # --------------------------------------------------------------------- persistence

    def save_pretrained(self, directory: str | Path) -> None:
        """config.json (model_type "toypref"), model.safetensors, tokenizer/ and checksums.json."""
        save_folder(self, MODEL_TYPE, asdict(self.config), self.clip.tokenizer, directory)

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu") -> ToyPref:
        raw, tokenizer, state = read_folder(directory, MODEL_TYPE, "margrpo train-toypref")
        model = build_checked(lambda: cls(ToyPrefConfig.from_dict(raw), tokenizer), Path(directory))
        return load_checked(model, state, Path(directory)).to(device).eval()


class ToyPrefReward(ToyClipReward):
    """The `toypref` reward: the preference score, float32 [B] (unbounded, like HPS's logits: only differences within
    a group mean anything, which is all GRPO uses). `metadata` is accepted for the reward protocol and not read."""

    model_class = ToyPref
    name = "toypref"

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.model(images, prompts)
