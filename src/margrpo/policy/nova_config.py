"""NOVA's transformer configuration and the published folder's names: what the policy and its folder reader both
need (policy.nova, policy.nova_files), kept apart so that neither imports the other."""

from __future__ import annotations

import re
from dataclasses import dataclass


def _pair(x) -> tuple[int, int]:
    return (int(x), int(x)) if isinstance(x, (int, float)) else tuple(int(v) for v in x)


TRANSFORMER_WEIGHTS = "diffusion_pytorch_model.safetensors"
TEXT_POSITIONS = 512  # rows of TextEmbed's filler table (NOVA's "maximum positions")
HEADS_BY_WIDTH = {768: 12, 1024: 16, 1536: 16}  # NOVA's registered ViT presets (transformer_nova.py)


# --- configuration ------------------------------------------------------------------------------
@dataclass
class NovaConfig:
    """The transformer's configuration; defaults are the published nova-d48w1024-sd512 values.

    NOVA's own `transformer/config.json` encodes the sizes in `arch` names (`vit_d16w1024`,
    `vit_d32w1024`, `mlp_d3w1280`); `from_nova_json` / `to_nova_json` convert.
    """

    image_size: tuple[int, int] = (512, 512)  # pixels (H, W)
    image_dim: int = 4  # VAE latent channels (SD VAE)
    image_stride: int = 8  # VAE downsampling; NOVA's patch size is 15 // stride + 1 = 2
    text_token_dim: int = 2560  # Phi-2 hidden size
    text_token_len: int = 256  # prompt positions; tokens past the prompt take TextEmbed's filler rows
    video_base_size: tuple[int, int, int] = (1, 16, 16)  # (frames, h, w) of the video encoder's 4x4-patch grid
    image_base_size: tuple[int, int] = (32, 32)  # token grid of the image encoder (2x2 patches)
    width: int = 1024  # both ViTs (arch[0], arch[1])
    num_heads: int = 16
    video_depth: int = 16  # arch[0] = vit_d16w1024
    image_depth: int = 32  # arch[1] = vit_d32w1024; its first half sees only the known tokens (MAE-style)
    mlp_ratio: float = 4.0
    head_depth: int = 3  # arch[2] = mlp_d3w1280 (the diffusion MLP)
    head_width: int = 1280
    flow_shift: float = 1.0  # sampling-grid shift of the flow scheduler (scheduler/scheduler_config.json)

    def __post_init__(self):
        self.image_size = _pair(self.image_size)
        self.image_base_size = tuple(self.image_base_size)
        self.video_base_size = tuple(self.video_base_size)
        if self.width % self.num_heads:
            raise ValueError(f"width {self.width} is not divisible by num_heads {self.num_heads}")
        latent = tuple(s // self.image_stride for s in self.image_size)
        if any(s % self.image_stride for s in self.image_size) or any(s % (2 * self.patch_size) for s in latent):
            raise ValueError(
                f"image_size {self.image_size} must be a multiple of image_stride * 2 * patch_size "
                f"= {self.image_stride * 2 * self.patch_size}"
            )
        grid = tuple(s // self.patch_size for s in latent)
        if self.image_base_size != grid:
            raise ValueError(
                f"image_base_size {self.image_base_size} must equal the token grid {grid}; "
                f"set image_base_size={list(grid)}"
            )
        if self.video_base_size[1:] != tuple(s // 2 for s in grid):
            raise ValueError(
                f"video_base_size[1:] {self.video_base_size[1:]} must equal the video patch grid "
                f"{tuple(s // 2 for s in grid)}; set video_base_size=[1, {grid[0] // 2}, {grid[1] // 2}]"
            )
        if self.text_token_len > TEXT_POSITIONS:
            raise ValueError(f"text_token_len {self.text_token_len} exceeds the {TEXT_POSITIONS} filler positions")

    @classmethod
    def full_size(cls) -> NovaConfig:
        """nova-d48w1024-sd512: 16 + 32 ViT blocks of width 1024, a 3 x 1280 diffusion MLP, 512 px."""
        return cls()

    @property
    def patch_size(self) -> int:
        return 15 // self.image_stride + 1  # NOVA's rule (transformer_nova.py): stride 8 -> 2

    @property
    def token_dim(self) -> int:
        return self.patch_size**2 * self.image_dim

    def to_nova_json(self) -> dict:
        """NOVA's transformer/config.json fields (plus num_heads / mlp_ratio, which NOVA's arch presets imply)."""
        return {
            "_class_name": "NOVATransformer3DModel",
            "image_dim": self.image_dim,
            "image_size": list(self.image_size),
            "image_stride": self.image_stride,
            "text_token_dim": self.text_token_dim,
            "text_token_len": self.text_token_len,
            "video_base_size": list(self.video_base_size),
            "image_base_size": list(self.image_base_size),
            "rotary_pos_embed": False,
            "num_heads": self.num_heads,
            "mlp_ratio": self.mlp_ratio,
            "arch": [
                f"vit_d{self.video_depth}w{self.width}",
                f"vit_d{self.image_depth}w{self.width}",
                f"mlp_d{self.head_depth}w{self.head_width}",
            ],
        }

    @classmethod
    def from_nova_json(cls, raw: dict, flow_shift: float = 1.0) -> NovaConfig:
        if raw.get("rotary_pos_embed") or raw.get("video_mixer_rank"):
            raise ValueError(
                "rotary_pos_embed / video_mixer_rank checkpoints are not supported; "
                "nova-d48w1024-sd512 uses absolute positions and no video mixer"
            )
        if not raw.get("text_token_dim"):
            raise ValueError("text_token_dim is missing: class-conditional NOVA (LabelEmbed) is not supported")
        parsed = [re.fullmatch(r"(vit|mlp)_d(\d+)w(\d+)", a) for a in raw["arch"]]
        if not all(parsed) or [p.group(1) for p in parsed] != ["vit", "vit", "mlp"]:
            raise ValueError(
                f"arch {raw['arch']!r}: expected [vit_d<depth>w<width>, vit_d<depth>w<width>, mlp_d<depth>w<width>]"
            )
        (_, vd, vw), (_, idp, iw), (_, hd, hw) = (p.groups() for p in parsed)
        if vw != iw:
            raise ValueError(f"arch {raw['arch']!r}: the video and image encoders must have the same width")
        width = int(iw)
        return cls(
            image_size=_pair(raw["image_size"]),
            image_dim=raw["image_dim"],
            image_stride=raw["image_stride"],
            text_token_dim=raw["text_token_dim"],
            text_token_len=raw["text_token_len"],
            video_base_size=tuple(raw["video_base_size"]),
            image_base_size=tuple(raw["image_base_size"]),
            width=width,
            num_heads=raw.get("num_heads") or HEADS_BY_WIDTH.get(width, max(1, width // 64)),
            video_depth=int(vd),
            image_depth=int(idp),
            mlp_ratio=raw.get("mlp_ratio", 4.0),
            head_depth=int(hd),
            head_width=int(hw),
            flow_shift=flow_shift,
        )
