"""The networks inside Harmon: MAR-H (LTH14/mar's encoder, decoder and DiffLoss MLP, with MAR's
parameter names) and MAR's KL-16 VAE as a diffusers AutoencoderKL with the LDM key names of kl16.ckpt.

`margrpo.policy.harmon` puts the Qwen2.5 LLM between this encoder and decoder; see its docstring.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL
from torch import Tensor, nn

from margrpo.policy.checkpointing import run_blocks
from margrpo.policy.harmon_config import HarmonConfig
from margrpo.policy.layers import modulate, timestep_embedding

# ----------------------------------------------------------------------------------------------
# MAR-H: ViT blocks with timm's parameter names, the encoder/decoder, the DiffLoss MLP


class Attention(nn.Module):
    """Multi-head self-attention (bidirectional)."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: Tensor) -> Tensor:
        B, S, W = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, W // self.heads).permute(2, 0, 3, 1, 4)  # 3 x [B, h, S, W/h]
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return F.dropout(self.proj(y.transpose(1, 2).reshape(B, S, W)), self.dropout, self.training)


class Mlp(nn.Module):
    def __init__(self, width: int, hidden: int, dropout: float):
        super().__init__()
        self.fc1, self.fc2, self.dropout = nn.Linear(width, hidden), nn.Linear(hidden, width), dropout

    def forward(self, x: Tensor) -> Tensor:
        h = F.dropout(F.gelu(self.fc1(x)), self.dropout, self.training)
        return F.dropout(self.fc2(h), self.dropout, self.training)


class Block(nn.Module):
    """Pre-norm ViT block named like timm's `Block` (MAR's), so `mar.*_blocks.*` keys load as they are."""

    def __init__(self, width: int, heads: int, mlp_ratio: float, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width, eps=1e-6), nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads, dropout)
        self.mlp = Mlp(width, int(width * mlp_ratio), dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ResBlock(nn.Module):
    """MAR's AdaLN residual MLP block (its LayerNorm keeps an affine, unlike the toy's)."""

    def __init__(self, width: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale, gate = self.adaLN_modulation(c).chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.in_ln(x), shift, scale))


class FinalLayer(nn.Module):
    def __init__(self, width: int, out_dim: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out_dim)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class TimestepEmbedder(nn.Module):
    def __init__(self, width: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, width), nn.SiLU(), nn.Linear(width, width))

    def forward(self, t: Tensor) -> Tensor:
        return self.mlp(timestep_embedding(t, self.freq_dim).to(self.mlp[0].weight.dtype))


class DiffusionMLP(nn.Module):
    """MAR's SimpleMLPAdaLN with its key names: out = [eps, variance values] (2 x token channels).

    The toy's `layers.SimpleMLPAdaLN` is the same network in spirit; this one matches MAR exactly
    (256-d frequency embedding, affine LayerNorm in the residual blocks) so checkpoints load.
    """

    gradient_checkpointing = False  # of the residual blocks (policy.checkpointing)

    def __init__(self, token_dim: int, z_dim: int, width: int, depth: int):
        super().__init__()
        self.time_embed = TimestepEmbedder(width)
        self.cond_embed = nn.Linear(z_dim, width)
        self.input_proj = nn.Linear(token_dim, width)
        self.res_blocks = nn.ModuleList(ResBlock(width) for _ in range(depth))
        self.final_layer = FinalLayer(width, 2 * token_dim)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight), nn.init.zeros_(m.bias)
        for lin in self.time_embed.mlp[0], self.time_embed.mlp[2]:
            nn.init.normal_(lin.weight, std=0.02)
        for lin in [b.adaLN_modulation[-1] for b in self.res_blocks] + [
            self.final_layer.adaLN_modulation[-1],
            self.final_layer.linear,
        ]:
            nn.init.zeros_(lin.weight), nn.init.zeros_(lin.bias)  # adaLN-zero

    def forward(self, x: Tensor, t: Tensor, z: Tensor) -> Tensor:
        h = self.input_proj(x.to(self.input_proj.weight.dtype))
        c = self.time_embed(t) + self.cond_embed(z.to(self.cond_embed.weight.dtype))  # [N, width]
        h = run_blocks(self.res_blocks, h, c, checkpointing=self.gradient_checkpointing)
        return self.final_layer(h, c)


class DiffLoss(nn.Module):
    """Holder of the head network, so that its keys read `mar.diffloss.net.*` as in the checkpoint."""

    def __init__(self, token_dim: int, z_dim: int, width: int, depth: int):
        super().__init__()
        self.net = DiffusionMLP(token_dim, z_dim, width, depth)


def resize_pos_embed(pe: Tensor, buffer: int, src: int, dst: int) -> Tensor:
    """[1, buffer + src^2, W] -> [1, buffer + dst^2, W]: buffer rows kept, the image grid resized bilinearly."""
    if src == dst:
        return pe
    grid = pe[:, buffer:].reshape(1, src, src, -1).permute(0, 3, 1, 2)  # [1, W, src, src]
    grid = F.interpolate(grid, size=(dst, dst), mode="bilinear", align_corners=False)
    return torch.cat([pe[:, :buffer], grid.flatten(2).transpose(1, 2)], dim=1)


class MAR(nn.Module):
    """MAR's encoder, decoder and head with MAR's parameter names (Harmon's `mar.*`)."""

    gradient_checkpointing = False  # of the encoder and decoder blocks (policy.checkpointing)

    def __init__(self, c: HarmonConfig):
        super().__init__()
        self.buffer_size, self.pos_grid = c.buffer_size, c.pos_grid
        We, Wd, n_pos = c.encoder_width, c.decoder_width, c.pos_grid**2
        self.class_emb = nn.Embedding(c.num_classes, We)
        self.fake_latent = nn.Parameter(torch.zeros(1, We))  # the buffers' content (MAR's unconditional class)
        self.z_proj = nn.Linear(c.token_dim, We)
        self.z_proj_ln = nn.LayerNorm(We, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, c.buffer_size + n_pos, We))
        self.encoder_blocks = nn.ModuleList(
            Block(We, c.encoder_heads, c.mlp_ratio, c.dropout) for _ in range(c.encoder_depth)
        )
        self.encoder_norm = nn.LayerNorm(We, eps=1e-6)
        self.decoder_embed = nn.Linear(We, Wd)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, Wd))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, c.buffer_size + n_pos, Wd))
        self.decoder_blocks = nn.ModuleList(
            Block(Wd, c.decoder_heads, c.mlp_ratio, c.dropout) for _ in range(c.decoder_depth)
        )
        self.decoder_norm = nn.LayerNorm(Wd, eps=1e-6)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, n_pos, Wd))
        for m in self.modules():  # MAR's init (checkpoints overwrite it; tests use it)
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight), nn.init.zeros_(m.bias)
        for p in (
            self.class_emb.weight,
            self.fake_latent,
            self.mask_token,
            self.encoder_pos_embed_learned,
            self.decoder_pos_embed_learned,
            self.diffusion_pos_embed_learned,
        ):
            nn.init.normal_(p, std=0.02)
        self.diffloss = DiffLoss(c.token_dim, Wd, c.head_width, c.head_depth)

    def encode(self, x: Tensor, idx: Tensor, grid: int) -> Tensor:
        """Known tokens x [B, n, D] at raster positions idx [B, n] -> [B, buffer + n, We], buffers first."""
        B, nb = x.shape[0], self.buffer_size
        pe = resize_pos_embed(self.encoder_pos_embed_learned, nb, self.pos_grid, grid)[0]  # [nb + L, We]
        h = self.z_proj(x.to(self.z_proj.weight.dtype)) + pe[nb:][idx]  # [B, n, We]
        buffers = (self.fake_latent + pe[:nb]).expand(B, -1, -1)  # [B, nb, We]
        h = self.z_proj_ln(torch.cat([buffers.to(h.dtype), h], dim=1))
        h = run_blocks(self.encoder_blocks, h, checkpointing=self.gradient_checkpointing)
        return self.encoder_norm(h)

    def decode(self, h: Tensor, perm: Tensor, known: Tensor, grid: int) -> Tensor:
        """Encoder states [B, buffer + n, We] -> z [B, L, Wd]; `perm` [B, L] lists known positions first."""
        nb = self.buffer_size
        x = self.decoder_embed(h)  # [B, nb + n, Wd]
        buffers, packed = x[:, :nb], x[:, nb:]
        B, L = known.shape
        mask_token = self.mask_token.to(x.dtype).expand(B, L, -1)
        if packed.shape[1] == 0:  # nothing known yet
            tokens = mask_token
        else:  # unpack: position l holds packed slot argsort(perm)[l] if it is known
            slot = torch.argsort(perm, dim=1).clamp(max=packed.shape[1] - 1)  # [B, L]
            tokens = torch.where(
                known[..., None], packed.gather(1, slot[..., None].expand(-1, -1, x.shape[-1])), mask_token
            )
        x = torch.cat([buffers, tokens], dim=1) + resize_pos_embed(
            self.decoder_pos_embed_learned, nb, self.pos_grid, grid
        )
        x = run_blocks(self.decoder_blocks, x, checkpointing=self.gradient_checkpointing)
        x = self.decoder_norm(x)[:, nb:]
        return x + resize_pos_embed(self.diffusion_pos_embed_learned, 0, self.pos_grid, grid)  # z [B, L, Wd]


def build_mlp(width_in: int, hidden: int, width_out: int) -> nn.Sequential:
    """Harmon's projector between MAR and the LLM: Linear - SiLU - Linear (keys .0 and .2)."""
    return nn.Sequential(nn.Linear(width_in, hidden), nn.SiLU(), nn.Linear(hidden, width_out))


# ----------------------------------------------------------------------------------------------
# KL-16 VAE: diffusers AutoencoderKL + the LDM key names of kl16.ckpt


def build_vae(c: HarmonConfig) -> AutoencoderKL:
    """MAR's KL-16 as a diffusers AutoencoderKL: the same blocks (LDM resnets, pad-(0,1) downsampling,
    one-head attention at the lowest encoder level and in both mid blocks, none in the decoder's levels)."""
    n = len(c.vae_channels)
    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * (n - 1) + ("AttnDownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",) * n,
        block_out_channels=c.vae_channels,
        layers_per_block=c.vae_layers_per_block,
        latent_channels=c.vae_latent_channels,
        norm_num_groups=c.vae_norm_groups,
        sample_size=c.image_size,
        scaling_factor=c.vae_scale,
        force_upcast=False,
    )


_VAE_RULES = [  # diffusers name pattern -> LDM name (decoder levels are counted from the other end)
    (r"(en|de)coder\.conv_norm_out\.", lambda m, n: f"{m[1]}coder.norm_out."),
    (r"encoder\.down_blocks\.(\d+)\.resnets\.", lambda m, n: f"encoder.down.{m[1]}.block."),
    (r"encoder\.down_blocks\.(\d+)\.attentions\.", lambda m, n: f"encoder.down.{m[1]}.attn."),
    (r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.", lambda m, n: f"encoder.down.{m[1]}.downsample."),
    (r"decoder\.up_blocks\.(\d+)\.resnets\.", lambda m, n: f"decoder.up.{n - 1 - int(m[1])}.block."),
    (r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.", lambda m, n: f"decoder.up.{n - 1 - int(m[1])}.upsample."),
    (r"(en|de)coder\.mid_block\.resnets\.(\d)\.", lambda m, n: f"{m[1]}coder.mid.block_{int(m[2]) + 1}."),
    (r"(en|de)coder\.mid_block\.attentions\.0\.", lambda m, n: f"{m[1]}coder.mid.attn_1."),
]
_VAE_LEAVES = {
    "conv_shortcut": "nin_shortcut",
    "group_norm": "norm",
    "to_q": "q",
    "to_k": "k",
    "to_v": "v",
    "to_out.0": "proj_out",
}


def vae_key_to_ldm(name: str, levels: int) -> str:
    """A diffusers AutoencoderKL parameter name -> its name in an LDM/MAR KL checkpoint."""
    for pattern, ldm in _VAE_RULES:
        m = re.match(pattern, name)
        if m:
            name = ldm(m, levels) + name[m.end() :]
            break
    prefix, _, leaf = name.rpartition(".")  # leaf = weight / bias
    for new, old in _VAE_LEAVES.items():
        if prefix.endswith("." + new):
            prefix = prefix[: -len(new)] + old
    return f"{prefix}.{leaf}"
