"""toyclip: the learned toy image-text reward of ShapesWorld (the analogue of HPS, design.md §4).

A small CLIP-style dual encoder trained from scratch by `margrpo train-toyclip`:

- image tower: CoordConv CNN (4 convs with GroupNorm + SiLU, three of them stride 2 after a
  stride-2 stem at 64 px, then a 1x1 conv) and global average pooling: a bag of per-location
  features, each seeing about one object; coordinate channels let a feature record where its
  object sits ("left of");
- text tower: a tiny pre-norm transformer (`margrpo.policy.layers.TextEncoder`, learned
  relative-position attention bias) over a word-level tokenizer of the world's vocabulary,
  mean-pooled: a bag of contextual word states, the text-side analogue;
- both projected to `embed_dim` and L2-normalised; score = cosine similarity in [-1, 1].

Training and its held-out evaluation (`train_toyclip`, `evaluate_ranking`) live in
`margrpo.toylab.toyclip_training`, the hard negatives they use in `margrpo.world.negatives`.

Being learned, the scorer is hackable: it is only as good as its training distribution, which
is what the paper's instability story needs. Attribute presence (colour, shape, texture, count)
ranks near-perfectly; binding and relations are its weak spots (see the training metrics).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor, nn

from margrpo.infra.files import InputError, atomic_write_text, record_checksums, save_safetensors, verify_checksums
from margrpo.policy.layers import TextEncoder
from margrpo.policy.text import SPECIAL_TOKENS, WordTokenizer, build_tokenizer  # noqa: F401  (re-exported)

__all__ = [
    "ToyClipConfig",
    "ToyClip",
    "ToyClipReward",
    "build_tokenizer",
]

MODEL_TYPE = "toyclip"
CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_DIR = "config.json", "model.safetensors", "tokenizer"
TEXT_POOLS = ("mean", "cls")
TEXT_POSITIONS = (
    "relative",
    "absolute",
)  # absolute embeddings, plus a learned relative-position attention bias or not


# ============================================================================ config


@dataclass
class ToyClipConfig:
    """Sizes of the dual encoder; the vocabulary is recorded so the tokenizer can be rebuilt."""

    image_size: int = 32  # images of another size are resized to this before scoring
    width: int = 64  # channels of the last CNN stage (earlier stages: width / 4, width / 2)
    embed_dim: int = 64  # joint embedding size
    text_width: int = 64  # hidden size of the text transformer
    text_depth: int = 2  # transformer layers
    text_heads: int = 4
    text_mlp_ratio: int = 2  # transformer MLP width / text_width
    text_pool: str = "mean"  # "mean" over tokens (a bag of bound phrases, like the image's average pool) or "cls"
    text_positions: str = "relative"  # relative: "attend to the previous word" is learnt once, not per position
    max_text_len: int = 32  # tokens incl. [CLS]; longer prompts are truncated
    logit_scale_init: float = math.log(1 / 0.07)  # CLIP's temperature init
    logit_scale_max: float = math.log(100.0)  # CLIP's clamp
    vocab: list[str] = field(default_factory=list)  # prompt words; others map to [UNK]

    @property
    def stem_stride(self) -> int:
        """1 up to 63 px, 2 from 64 px: the CNN runs at <= 32 px after its first conv, so a 64-px
        world costs about what a 32-px one does and a final position covers one 16-px grid cell."""
        return max(1, self.image_size // 32)

    def __post_init__(self) -> None:
        if self.image_size % (8 * self.stem_stride):
            raise ValueError(
                f"image_size={self.image_size} must be a multiple of {8 * self.stem_stride} "
                f"(a stride-{self.stem_stride} stem and three stride-2 stages)"
            )
        if self.width % 4 or self.width < 8:
            raise ValueError(f"width={self.width} must be a multiple of 4 and >= 8")
        if self.text_width % self.text_heads:
            raise ValueError(f"text_width={self.text_width} is not divisible by text_heads={self.text_heads}")
        if self.text_positions not in TEXT_POSITIONS:
            raise ValueError(f"Unknown text_positions: {self.text_positions!r}; expected one of {TEXT_POSITIONS}")
        if self.text_pool not in TEXT_POOLS:
            raise ValueError(f"Unknown text_pool: {self.text_pool!r}; expected one of {TEXT_POOLS}")
        if self.max_text_len < 2:
            raise ValueError(f"max_text_len={self.max_text_len} leaves no room after [CLS]; use >= 2")


# ============================================================================ model


def _conv_block(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1),
        nn.GroupNorm(math.gcd(c_out, 8), c_out),
        nn.SiLU(),
    )


class ImageTower(nn.Module):
    """[B, 3, s, s] in [0, 1] -> [B, embed_dim] (not normalised).

    Coordinate channels (CoordConv) let the convolutions write *where* an object is into its
    features, so global average pooling keeps both what is in the scene (a bag of bound
    colour-shape-texture features, independent of the cell an object sits in, as a caption without
    a relation needs) and the layout a relation caption needs.
    """

    def __init__(self, c: ToyClipConfig):
        super().__init__()
        w = c.width
        self.convs = nn.Sequential(
            _conv_block(3 + 2, w // 4, c.stem_stride),  # r = s / stem_stride; + 2 coordinate channels
            _conv_block(w // 4, w // 2, 2),  # r/2
            _conv_block(w // 2, w, 2),  # r/4
            _conv_block(w, w, 2),  # r/8
            nn.Conv2d(w, w, 1),  # r/8, per position: conjunctions (red AND corner) without mixing neighbouring objects
            nn.SiLU(),
        )
        self.proj = nn.Sequential(nn.Linear(w, w), nn.SiLU(), nn.Linear(w, c.embed_dim))
        ramp = torch.linspace(-1.0, 1.0, c.image_size)
        yy, xx = torch.meshgrid(ramp, ramp, indexing="ij")
        self.register_buffer("coords", torch.stack([xx, yy])[None], persistent=False)  # [1, 2, s, s]

    def forward(self, images: Tensor) -> Tensor:
        x = images * 2 - 1  # [B, 3, s, s] in [-1, 1]
        x = torch.cat([x, self.coords.expand(x.shape[0], -1, -1, -1).to(x.dtype)], dim=1)  # [B, 5, s, s]
        h = self.convs(x)  # [B, width, r/8, r/8]
        return self.proj(h.mean(dim=(2, 3)))  # global average pool -> [B, embed_dim]


class TextTower(nn.Module):
    """Token ids [N, L] (+ attention mask) -> [N, embed_dim] (not normalised), pooled per `text_pool`."""

    def __init__(self, c: ToyClipConfig, vocab_size: int):
        super().__init__()
        self.encoder = TextEncoder(
            vocab_size,
            c.text_width,
            c.text_depth,
            c.text_heads,
            c.max_text_len,
            c.text_mlp_ratio,
            relative=c.text_positions == "relative",
        )
        self.pool = c.text_pool
        self.proj = nn.Linear(c.text_width, c.embed_dim)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = self.encoder(input_ids, attention_mask)  # [N, L, text_width]
        if self.pool == "cls":
            pooled = hidden[:, 0]  # [N, text_width]
        else:  # mean over real tokens ([CLS] included, padding excluded)
            m = attention_mask[..., None].to(hidden.dtype)  # [N, L, 1]
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1)  # [N, text_width]
        return self.proj(pooled)  # [N, embed_dim]


class ToyClip(nn.Module):
    """Dual encoder with a learnable logit scale; `score` is the cosine similarity in [-1, 1]."""

    def __init__(self, config: ToyClipConfig, tokenizer: WordTokenizer | None = None):
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer or build_tokenizer(config.vocab)
        self.image_tower = ImageTower(config)
        self.text_tower = TextTower(config, len(self.tokenizer))
        self.logit_scale = nn.Parameter(torch.tensor(float(config.logit_scale_init)))

    @property
    def device(self) -> torch.device:
        return self.logit_scale.device

    fixed_text_length = False  # set by the reward wrapper: shapes that never depend on the batch's prompts

    def tokenize(self, prompts: list[str]) -> dict[str, Tensor]:
        batch = self.tokenizer(prompts, max_length=self.config.max_text_len, fixed_length=self.fixed_text_length)
        return {
            "input_ids": batch["input_ids"].to(self.device),
            "attention_mask": batch["attention_mask"].to(self.device),
        }

    def encode_images(self, images: Tensor) -> Tensor:
        """[B, 3, H, W] in [0, 1] -> unit vectors [B, embed_dim]."""
        s = self.config.image_size
        if images.shape[-2:] != (s, s):
            images = F.interpolate(images, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        return F.normalize(self.image_tower(images).float(), dim=-1)

    def encode_text(self, prompts: list[str]) -> Tensor:
        """N prompts -> unit vectors [N, embed_dim]."""
        return F.normalize(self.text_tower(**self.tokenize(prompts)).float(), dim=-1)

    def scale(self) -> Tensor:
        """exp(logit_scale), clamped like CLIP."""
        return self.logit_scale.clamp(max=self.config.logit_scale_max).exp()

    @torch.no_grad()
    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        """Cosine similarity of each image with its own prompt: [B] float32 in [-1, 1]."""
        return (self.encode_images(images) * self.encode_text(prompts)).sum(-1)

    # --------------------------------------------------------------------- persistence

    def save_pretrained(self, directory: str | Path) -> None:
        """Write config.json (model_type "toyclip"), model.safetensors, tokenizer/ and their checksums.json
        into `directory`."""
        save_folder(self, MODEL_TYPE, asdict(self.config), self.tokenizer, directory)

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu") -> ToyClip:
        raw, tokenizer, state = read_folder(directory, MODEL_TYPE, "margrpo train-toyclip")
        model = build_checked(lambda: cls(ToyClipConfig(**raw), tokenizer), Path(directory))
        return load_checked(model, state, Path(directory)).to(device).eval()


# ============================================================================ model folders


def save_folder(
    model: nn.Module, model_type: str, config: dict, tokenizer: WordTokenizer, directory: str | Path
) -> None:
    """A learned toy reward's folder: config.json (with `model_type`), model.safetensors, tokenizer/,
    checksums.json."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    save_safetensors({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, d / WEIGHTS_FILE)
    atomic_write_text(d / CONFIG_FILE, json.dumps({"model_type": model_type, **config}, indent=1) + "\n")
    tokenizer.save_pretrained(str(d / TOKENIZER_DIR))
    record_checksums(d)  # checked on load


def read_folder(directory: str | Path, model_type: str, writer: str) -> tuple[dict, WordTokenizer, dict]:
    """(config without model_type, tokenizer, state dict) of a folder `save_folder` wrote, after its checksums; every
    problem named with its file (`writer`: the command that writes such folders)."""
    d = Path(directory)
    expected = f"{CONFIG_FILE}, {WEIGHTS_FILE} and {TOKENIZER_DIR}/ (written by `{writer}`)"
    if not d.is_dir():
        raise FileNotFoundError(f"{model_type} model folder {d} does not exist; expected it to hold {expected}")
    missing = [n for n in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_DIR) if not (d / n).exists()]
    if missing:
        raise FileNotFoundError(f"{d} is not a {model_type} model: missing {', '.join(missing)}; expected {expected}")
    verify_checksums(d)
    try:
        raw = json.loads((d / CONFIG_FILE).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{d / CONFIG_FILE}: not valid JSON ({err})") from err
    if not isinstance(raw, dict) or raw.pop("model_type", None) != model_type:
        raise ValueError(f"{d / CONFIG_FILE}: model_type is not {model_type!r}")
    tokenizer = WordTokenizer.from_pretrained(d / TOKENIZER_DIR)
    try:
        state = load_file(str(d / WEIGHTS_FILE))
    except Exception as err:  # safetensors raises its own error types for truncated / garbled files
        raise ValueError(f"{d / WEIGHTS_FILE}: corrupt or unreadable weights ({err})") from err
    return raw, tokenizer, state


def build_checked(build, d: Path):
    """`build()`, a config that does not fit the model class named as the folder's config.json."""
    try:
        return build()
    except TypeError as err:
        raise InputError(f"{d / CONFIG_FILE}: not a config of this model ({err})") from err


def load_checked(model: nn.Module, state: dict, d: Path) -> nn.Module:
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{d / WEIGHTS_FILE}: weights do not match {d / CONFIG_FILE} ({err})") from err
    return model


# ============================================================================ reward


class ToyClipReward:
    """The `toyclip` reward: cosine similarity of image and prompt embeddings, float32 [B] in [-1, 1].

    Like HPS it is a raw similarity, not a probability. Measured on the default model (64-px
    world, clean held-out renders): true captions 0.74 / 0.86 / 0.92 (5th / 50th / 95th
    percentile), another scene's caption -0.61 / 0.09 / 0.67, a one-attribute swap ~0.85 median;
    so only differences within a group are meaningful (which is all GRPO uses). `metadata` is accepted for the reward
    protocol and not used: the scorer sees only the text. Subclasses name another model folder class and its score.
    """

    model_class = ToyClip
    name = "toyclip"

    def __init__(self, path: str | Path, device: str | torch.device | None = None, batch_size: int = 16):
        """`batch_size`: images are scored in batches of exactly this many (the last padded with copies of its last
        image), their prompts padded to the longest possible, so that an image's score does not depend on what it
        is scored with (oneDNN's convolutions round by batch size: 2e-7 between batches of 2 and 8,
        docs/findings.md); a process count or a micro-batch split then changes no reward."""
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.path = Path(path)
        self.device = None if device is None else torch.device(device)
        self.batch_size = batch_size
        self.model = self.model_class.from_pretrained(self.path, device=self.device or "cpu").requires_grad_(False)
        for m in self.model.modules():  # prompts padded to the longest possible: the same shapes every batch
            if isinstance(m, ToyClip):
                m.fixed_text_length = True

    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        return self.model.score(images, prompts)

    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"{self.name} expects images [B, 3, H, W] in [0, 1], got shape {tuple(images.shape)}")
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        device = self.device or images.device  # the model follows the inputs unless pinned
        if self.model.device != device:
            self.model.to(device)
        self.model.eval()
        scores = []
        with torch.no_grad():
            for i in range(0, len(prompts), self.batch_size):
                chunk = images[i : i + self.batch_size].to(device=device, dtype=torch.float32).clamp(0, 1)
                texts, n = prompts[i : i + self.batch_size], len(chunk)
                pad = self.batch_size - n
                if pad:  # the same batch size every time: the same kernels, the same rounding
                    chunk, texts = torch.cat([chunk, chunk[-1:].expand(pad, -1, -1, -1)]), texts + texts[-1:] * pad
                scores.append(self.score(chunk, texts)[:n])  # [b]
        out = torch.cat(scores) if scores else torch.zeros(0)
        return out.to(device=images.device, dtype=torch.float32)
