"""`toy-mask`: a discrete masked-token policy on the toy world's cell grid (MaskGIT-style), for MaskGRPO.

One token per grid cell, drawn from a codebook of every content a cell can hold: empty, or one
(colour, shape, texture) of the world; plus a [MASK] id. A bidirectional transformer over the prompt
and the 16 cell tokens predicts a categorical over the codebook at every position.

Codec. `decode` pastes each cell's pre-rendered patch. Objects of the world sit at their cell centres
and never leave their cell (checked when the codebook is built), so the pasted image is exactly what
the world's renderer draws for the decoded scene (objects of the canonical size, the largest of
`size_range`), and every reward (toyclip, shapes, mixed) scores it unchanged. `encode_scenes` is exact
up to the object's size, which the codebook does not carry (11 or 12 px in the default world: the
parser reads both the same). `encode` maps images back by the nearest patch, exact on decoded images.

The generation loop, its record and the sampler live in `margrpo.related.maskgrpo.rollout`, as the continuous
policies' live in `margrpo.grpo.rollout`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from margrpo.policy.base import TextCondition
from margrpo.policy.checkpointing import run_blocks
from margrpo.policy.layers import Block
from margrpo.policy.text import WordTokenizer, build_tokenizer
from margrpo.policy.toy import encode_text, load_folder, read_folder_config, save_folder, text_encoder
from margrpo.world import PRESETS, ObjectSpec, Scene, WorldConfig, render

MODEL_TYPE = "toy-mask"


@dataclass
class ToyMaskConfig:
    world: dict = field(
        default_factory=lambda: PRESETS["grid4"].to_dict()
    )  # the pipeline's default world: 4 x 4 cells of 16 px
    width: int = 192  # transformer width
    depth: int = 4
    heads: int = 6
    mlp_ratio: float = 4.0
    text_width: int = 64
    text_depth: int = 2
    text_heads: int = 4
    max_text_len: int = 24
    dropout: float = 0.0  # pre-training regulariser; rollouts and log-prob passes run with dropout off
    vocab: list[str] = field(default_factory=list)  # prompt words; the tokenizer maps others to [UNK]

    def __post_init__(self):
        if self.width % self.heads or self.text_width % self.text_heads:
            raise ValueError("width must be divisible by heads and text_width by text_heads")
        world = WorldConfig.from_dict(self.world)
        if not world.snap or world.image_size % world.grid:
            raise ValueError(
                "toy-mask needs a snapped world (snap: true) whose image_size is a multiple of grid: "
                "one token per cell"
            )


class CellCodebook:
    """Cell contents <-> token ids: 0 = empty, then every (colour, shape, texture) of the world."""

    def __init__(self, world: WorldConfig):
        self.world, self.grid = world, world.grid
        self.cell, self.size = world.image_size // world.grid, world.size_range[1]
        self.entries: list[tuple[str, str, str] | None] = [
            None,
            *itertools.product(world.palette, world.shapes, world.textures),
        ]
        self.index = {e: i for i, e in enumerate(self.entries)}

    def __len__(self) -> int:
        return len(self.entries)

    def centre(self, cell: int) -> tuple[float, float]:
        """Where the world snaps an object of this cell (its centre, jitter clamped away:
        world.scene._snap_position)."""
        row, col = divmod(cell, self.grid)
        return float(round(col * self.cell + self.cell / 2)), float(round(row * self.cell + self.cell / 2))

    def encode(self, scene: Scene) -> list[int]:
        tokens = [0] * self.grid**2
        for obj in scene.objects:
            cell = int(obj.cy // self.cell) * self.grid + int(obj.cx // self.cell)
            if tokens[cell]:
                raise ValueError(f"two objects in cell {cell}; toy-mask holds one object per cell (a snapped world)")
            tokens[cell] = self.index[(obj.color, obj.shape, obj.texture)]
        return tokens

    def scene(self, tokens: list[int]) -> Scene:
        objects = []
        for cell, t in enumerate(tokens):
            if t:
                color, shape, texture = self.entries[t]
                objects.append(ObjectSpec(color, shape, texture, self.size, *self.centre(cell)))
        return Scene(tuple(objects))

    def patches(self) -> Tensor:
        """[V, 3, cell, cell] float in [0, 1]: each entry rendered alone in cell 0 by the world's renderer."""
        out = []
        for t in range(len(self)):
            image = render(self.scene([t] + [0] * (self.grid**2 - 1)), self.world)  # (H, W, 3) uint8
            if image[self.cell :].any() or image[:, self.cell :].any():
                raise ValueError(
                    f"{self.entries[t]} of {self.size} px spills out of its {self.cell}-px cell; "
                    "pasting patches would differ from the renderer: lower size_range or raise image_size"
                )
            out.append(torch.from_numpy(np.ascontiguousarray(image[: self.cell, : self.cell])).permute(2, 0, 1))
        return torch.stack(out).float() / 255


class ToyMaskPolicy(nn.Module):
    """Prompt-conditioned bidirectional transformer over cell tokens with a categorical head."""

    null_prompt = ""

    def __init__(self, config: ToyMaskConfig, tokenizer: WordTokenizer | None = None):
        super().__init__()
        c = self.config = config
        self.world = WorldConfig.from_dict(c.world)
        self.codebook = CellCodebook(self.world)
        self.tokenizer = tokenizer or build_tokenizer(c.vocab)
        self.seq_len, self.vocab_size = self.world.grid**2, len(self.codebook)
        self.mask_id = self.vocab_size  # one past the codebook
        self.text_encoder = text_encoder(len(self.tokenizer), c)
        self.text_proj = nn.Linear(c.text_width, c.width)
        self.token_embed = nn.Embedding(self.vocab_size + 1, c.width)  # codebook + [MASK]
        self.pos_embed = nn.Parameter(torch.zeros(1, self.seq_len, c.width))
        self.text_type = nn.Parameter(torch.zeros(1, 1, c.width))
        self.blocks = nn.ModuleList(Block(c.width, c.heads, c.mlp_ratio, c.dropout) for _ in range(c.depth))
        self.norm = nn.LayerNorm(c.width)
        self.out = nn.Linear(c.width, self.vocab_size)
        for p in (self.token_embed.weight, self.pos_embed, self.text_type):
            nn.init.normal_(p, std=0.02)
        self.register_buffer("patches", self.codebook.patches(), persistent=False)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # --- conditioning ---------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> TextCondition:
        return encode_text(self.text_encoder, self.tokenizer, prompts, self.config.max_text_len, self.device)

    def null_condition(self, batch: int) -> TextCondition:
        return self.encode_prompts([self.null_prompt] * batch)

    # --- the model ------------------------------------------------------------------------------
    def logits(self, tokens: Tensor, cond: TextCondition) -> Tensor:
        """Categorical logits [B, L, V] (float32) over the codebook at every position, given tokens [B, L]
        (codebook ids, or `mask_id` where unknown)."""
        B, L = tokens.shape
        x = self.token_embed(tokens) + self.pos_embed  # [B, L, W]
        text = self.text_proj(cond.hidden) + self.text_type  # [B, Lt, W]
        h = torch.cat([text.to(x.dtype), x], dim=1)  # [B, Lt + L, W]
        key_mask = torch.cat([cond.mask, torch.ones(B, L, dtype=torch.bool, device=x.device)], dim=1)
        h = run_blocks(self.blocks, h, key_mask)
        return self.out(self.norm(h[:, -L:])).float()

    def guided_logits(self, tokens: Tensor, cond: TextCondition, uncond: TextCondition | None, scale: float) -> Tensor:
        """Classifier-free guidance on the logits, u + s (c - u), both branches in one pass; s = 1 (or no
        `uncond`) is the conditional model alone."""
        if uncond is None or scale == 1.0:
            return self.logits(tokens, cond)
        out_c, out_u = self.logits(torch.cat([tokens, tokens]), TextCondition.cat([cond, uncond])).chunk(2)
        return out_u + scale * (out_c - out_u)

    # --- codec ------------------------------------------------------------------------------------
    def encode_scenes(self, scenes: list[Scene]) -> Tensor:
        """Scenes -> tokens [B, L] (exact up to the object size)."""
        return torch.tensor([self.codebook.encode(s) for s in scenes], dtype=torch.long, device=self.device)

    def scenes(self, tokens: Tensor) -> list[Scene]:
        return [self.codebook.scene(row) for row in tokens.tolist()]

    def decode(self, tokens: Tensor) -> Tensor:
        """Tokens [B, L] -> images [B, 3, H, W] in [0, 1]: the renderer's pixels for the decoded scenes."""
        g, c = self.world.grid, self.codebook.cell
        x = self.patches[tokens.clamp(max=self.vocab_size - 1)]  # [B, L, 3, c, c]; a stray [MASK] draws nothing
        x = torch.where((tokens == self.mask_id)[..., None, None, None], torch.zeros_like(x), x)
        return x.reshape(-1, g, g, 3, c, c).permute(0, 3, 1, 4, 2, 5).reshape(-1, 3, g * c, g * c)

    def encode(self, images: Tensor) -> Tensor:
        """Images [B, 3, H, W] in [0, 1] -> tokens [B, L]: the nearest codebook patch of every cell."""
        g, c = self.world.grid, self.codebook.cell
        cells = images.float().reshape(-1, 3, g, c, g, c).permute(0, 2, 4, 1, 3, 5).reshape(-1, g * g, 3 * c * c)
        book = self.patches.reshape(1, self.vocab_size, -1).expand(len(cells), -1, -1)
        return torch.cdist(cells, book).argmin(-1)  # [B, L]

    # --- parameter groups -------------------------------------------------------------------------
    def rl_parameters(self) -> Iterator[nn.Parameter]:
        """Everything but the text encoder, which RL keeps frozen (as the toy MAR's ar_parameters)."""
        return (p for n, p in self.named_parameters() if not n.startswith("text_encoder."))

    # --- Hugging Face style persistence ---------------------------------------------------------------
    def save_pretrained(self, directory: str | Path) -> None:
        save_folder(self, MODEL_TYPE, directory)

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu") -> ToyMaskPolicy:
        return load_folder(cls, ToyMaskConfig, read_folder_config(directory, MODEL_TYPE), directory).to(device).eval()
