"""Building blocks of the toy MAR: a pre-norm transformer block and MAR's SimpleMLPAdaLN head.

Attention is written out rather than taken from `nn.TransformerEncoder`, because the latter
switches to a fused "fast path" when gradients are off; the rollout (no grad) and the GRPO
recomputation (grad) must run the very same arithmetic for the ratio to be 1. On CPU the explicit
softmax(QK^T)V is used: for these short sequences (~30 positions) it is ~5x faster forward+backward
in bf16 than `scaled_dot_product_attention`'s CPU flash kernel (25.6 vs 5.3 ms per call, measured).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from margrpo.policy.checkpointing import run_blocks


class Attention(nn.Module):
    """`fused`: scaled_dot_product_attention on CPU too (as always on CUDA)."""

    def __init__(self, width: int, heads: int, dropout: float = 0.0, fused: bool = False):
        super().__init__()
        self.heads, self.dropout, self.fused = heads, dropout, fused
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: Tensor, key_mask: Tensor | None, bias: Tensor | None = None) -> Tensor:
        """`bias` [h, S, S] (optional) is added to the attention logits (the text encoder's relative positions)."""
        B, S, W = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, W // self.heads).permute(2, 0, 3, 1, 4)  # 3 x [B, h, S, W/h]
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]  # [B, 1, 1, S], True = attend
        dropout = self.dropout if self.training else 0.0
        if x.is_cuda or self.fused:
            if bias is not None:  # one additive float mask
                bias = bias.to(q.dtype).expand(B, -1, -1, -1)
                attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
        else:
            scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # [B, h, S, S]
            if bias is not None:
                scores = scores + bias
            if attn_mask is not None:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            y = F.dropout(scores.softmax(-1), dropout, training=dropout > 0) @ v
        return self.proj(y.transpose(1, 2).reshape(B, S, W))


class Block(nn.Module):
    """Pre-norm transformer block (bidirectional); `post_norm`: BERT's order, LayerNorm after each residual."""

    def __init__(
        self,
        width: int,
        heads: int,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        fused: bool = False,
        post_norm: bool = False,
    ):
        super().__init__()
        self.post_norm = post_norm
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads, dropout, fused)
        hidden = int(width * mlp_ratio)
        self.mlp = nn.Sequential(
            nn.Linear(width, hidden), nn.GELU(approximate="tanh"), nn.Dropout(dropout), nn.Linear(hidden, width)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, key_mask: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
        if self.post_norm:
            x = self.norm1(x + self.drop(self.attn(x, key_mask, bias)))
            return self.norm2(x + self.drop(self.mlp(x)))
        x = x + self.drop(self.attn(self.norm1(x), key_mask, bias))
        return x + self.drop(self.mlp(self.norm2(x)))


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10000.0) -> Tensor:
    """Sinusoidal embedding [N, dim] of float times t [N] (DDPM / MAR convention, t in [0, 1000))."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    return x * (1 + scale) + shift


class ResBlock(nn.Module):
    """MLP residual block with adaptive LayerNorm (shift, scale, gate) from the condition."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        shift, scale, gate = self.ada(c).chunk(3, dim=-1)
        return x + gate * self.mlp(modulate(self.norm(x), shift, scale))


class SimpleMLPAdaLN(nn.Module):
    """MAR's diffusion head: an MLP over one token, conditioned on z and t through AdaLN."""

    gradient_checkpointing = False  # of the residual blocks (policy.checkpointing)

    def __init__(self, token_dim: int, cond_dim: int, width: int, depth: int, out_dim: int, z_input: bool = False):
        super().__init__()
        # z_input: also add a projection of z to the input features (not only through AdaLN), which
        # gives the AR model a gradient from the first step instead of after the adaLN-zero gates open
        self.z_proj = nn.Linear(cond_dim, width) if z_input else None
        self.time_embed = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.cond_embed = nn.Linear(cond_dim, width)
        self.input_proj = nn.Linear(token_dim, width)
        self.blocks = nn.ModuleList(ResBlock(width) for _ in range(depth))
        self.final_norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.out = nn.Linear(width, out_dim)
        self.width = width
        # adaLN-zero: every block starts as the identity, the output as zero
        for block in self.blocks:
            nn.init.zeros_(block.ada[-1].weight), nn.init.zeros_(block.ada[-1].bias)
        for layer in (self.final_ada[-1], self.out):
            nn.init.zeros_(layer.weight), nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor, t: Tensor, z: Tensor) -> Tensor:
        c = self.time_embed(timestep_embedding(t, self.width).to(x.dtype)) + self.cond_embed(z)  # [N, width]
        h = self.input_proj(x)
        if self.z_proj is not None:
            h = h + self.z_proj(z)
        h = run_blocks(self.blocks, h, c, checkpointing=self.gradient_checkpointing)
        shift, scale = self.final_ada(c).chunk(2, dim=-1)
        return self.out(modulate(self.final_norm(h), shift, scale))


class TextEncoder(nn.Module):
    """Token ids [B, L] + attention mask -> hidden states [B, L, width]: token and learned position
    embeddings, then transformer blocks that ignore padding keys: pre-norm with a final LayerNorm, or
    (`post_norm`) BERT's layout, LayerNorm on the embeddings and after every residual.

    `relative`: each block's attention also gets a learned per-head bias for the offset between
    query and key (clipped to +-(max_len - 1)), so "the word before" is one thing to learn, not one
    per position. Attention is fused on CPU too: its output for a prompt then does not depend on the
    padding of the batch it came in (bitwise, measured; the explicit softmax path differs by ~1 ulp), so
    a GRPO rollout and its replay in other batch shapes see the same condition, as they did with BERT.
    """

    def __init__(
        self,
        vocab_size: int,
        width: int,
        depth: int,
        heads: int,
        max_len: int,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        relative: bool = False,
        post_norm: bool = False,
    ):
        super().__init__()
        self.max_len = max_len
        self.token_embeddings = nn.Embedding(vocab_size, width)
        self.position_embeddings = nn.Embedding(max_len, width)
        self.relative_bias = nn.Parameter(torch.zeros(depth, heads, 2 * max_len - 1)) if relative else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            Block(width, heads, mlp_ratio, dropout, fused=True, post_norm=post_norm) for _ in range(depth)
        )
        # post_norm: BERT's layout (LayerNorm on the embeddings and after every residual) and init (N(0, 0.02)
        # weights, zero biases); the toy policies measured better with it than pre-norm (docs/findings.md)
        self.embed_norm = nn.LayerNorm(width) if post_norm else nn.Identity()
        self.norm = nn.Identity() if post_norm else nn.LayerNorm(width)
        for m in self.modules() if post_norm else ():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        for emb in (self.token_embeddings, self.position_embeddings):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        L = input_ids.shape[1]
        if L > self.max_len:
            raise ValueError(f"{L} text tokens exceed max_len={self.max_len}")
        pos = torch.arange(L, device=input_ids.device)
        h = self.drop(self.embed_norm(self.token_embeddings(input_ids) + self.position_embeddings(pos)))  # [B, L, W]
        key_mask = attention_mask.bool()
        offsets = (pos[None, :] - pos[:, None]) + self.max_len - 1  # [L, L] key - query, shifted to >= 0
        for i, block in enumerate(self.blocks):
            bias = None if self.relative_bias is None else self.relative_bias[i][:, offsets].to(h.dtype)  # [h, L, L]
            h = block(h, key_mask, bias)
        return self.norm(h)
