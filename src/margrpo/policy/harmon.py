"""Harmon-1.5B text-to-image as a MAR policy: our own implementation, state-dict compatible.

Harmon (Wu et al. 2025, github.com/wusize/Harmon) puts a Qwen2.5 LLM between the encoder and the
decoder of a MAR-H (github.com/LTH14/mar). One AR step reads, per image:

    known tokens --MAR encoder (+ 64 buffer slots holding `fake_latent`)--> x_enc
    [prompt embeddings, proj_in(x_enc) with the buffers moved last] --Qwen2 (causal)--> h
    x_enc + proj_out(h, buffers moved back first) --MAR decoder (mask tokens at unknown slots)--> z
    z --DiffLoss MLP (eps + learned-range variance, cosine DDPM)--> the head

The buffers go after the image tokens in the LLM because its attention is causal: only there do
they see every known token. Tokens are the KL-16 VAE latent (16 channels, stride 16) times 0.2325,
in raster order, one token per latent pixel (patch size 1). Harmon's positional embeddings were
learned on a 16x16 grid (256 px) and are resized bilinearly to the 32x32 grid of its 512 px
generation (1024 tokens), as its sampler does.

Prompt template (Harmon's config and text2image script): the user prompt becomes
"Generate an image: {prompt}" inside the chat turn
"<|im_start|>user\\n{input}<|im_end|>\\n<|im_start|>assistant\\n" (no system turn); the CFG branch
uses the bare message "Generate an image." in the same turn. Prompts are right-padded.

KV cache. Harmon's sampler computes the prompt's keys/values once and appends the image tokens
with the cache; its training pass runs prompt and image tokens in one forward. Under the causal
mask the prompt's states never depend on the image tokens, so both are the same function. We run
the one-pass form in every `ar_forward` (rollout and GRPO replay alike): one code path, the same
arithmetic in both (DESIGN 3.2, ratio == 1), and gradients reach the prompt's states too. The price
is recomputing ~30 prompt positions next to 64 buffers plus up to 1024 image tokens per call.

Only known tokens enter the encoder and the LLM (Harmon drops the masked ones), packed in raster
order. The GRPO replay stacks AR steps that know different numbers of tokens, so `ar_forward` runs
one pass per known count: no padding, and each row sees exactly the shapes it saw in the rollout.
That matters beyond speed: padding the packed tokens to a common length changes z by ~1e-6 in
float32, and with eps prediction the noisiest DDPM step (t = 999) turns that into ~1e-2 in its
log-prob (both measured on the tiny test model): the ratio test of DESIGN 3.2 then fails.

Checkpoint folder (the published files of huggingface.co/wusize/harmon plus the LLM's config):

    <dir>/harmon_1.5b.pth          Harmon's weights: llm.*, mar.*, proj_in.*, proj_out.* (no vae.*)
    <dir>/kl16.ckpt                MAR's KL-16 VAE: {"model": LDM-style state dict}
    <dir>/Qwen2.5-1.5B-Instruct/   config.json, tokenizer.json, tokenizer_config.json of
                                   Qwen/Qwen2.5-1.5B-Instruct (its weights, if present, are not read)
    <dir>/config.json              optional: {"model_type": "harmon", ...HarmonConfig}; when absent
                                   the Harmon-1.5B values are used (`HarmonConfig()`)

`save_pretrained` writes exactly this layout (config.json included). Weights load with
`torch.load(weights_only=True)`, strictly; the VAE runs as `diffusers.AutoencoderKL` with the
LDM key names mapped on load and save.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterator

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL
from torch import Tensor, nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from margrpo.diffusion import DDPMConfig, DDPMSampler, Sampler
from margrpo.io import atomic_path, atomic_write_json
from margrpo.policy.base import MARPolicy, TextCondition
from margrpo.policy.layers import modulate, timestep_embedding

CONFIG = "config.json"
LLM_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")

# Qwen/Qwen2.5-1.5B-Instruct config.json (the LLM Harmon-1.5B starts from; its configs/models file)
QWEN2_5_1_5B_INSTRUCT = dict(
    model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
    num_attention_heads=12, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=32768,
    rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
    sliding_window=32768, max_window_layers=21, attention_dropout=0.0, bos_token_id=151643, eos_token_id=151645,
)
# MAR's DiffLoss: 1000-step cosine process, eps prediction, learned-range variance (learn_sigma=True)
HEAD_PROCESS = DDPMConfig(num_train_steps=1000, noise_schedule="cosine", variance="learned_range", prediction="eps")


@dataclass
class HarmonConfig:
    """Harmon sizes; the defaults are Harmon-1.5B (configs/models/qwen2_5_1_5b_kl16_mar_h.py, mar_huge)."""

    llm: dict = field(default_factory=lambda: dict(QWEN2_5_1_5B_INSTRUCT))  # Qwen2Config fields
    attn_implementation: str = "sdpa"  # the LLM's attention kernel ("sdpa" or "eager")
    # MAR-H encoder / decoder
    encoder_width: int = 1280
    encoder_depth: int = 20
    encoder_heads: int = 16
    decoder_width: int = 1280  # = z_dim
    decoder_depth: int = 20
    decoder_heads: int = 16
    mlp_ratio: float = 4.0
    buffer_size: int = 64  # class-token slots in front of the image tokens (hold `fake_latent`)
    num_classes: int = 1000  # MAR's class embedding: unused for text-to-image, kept for the checkpoint keys
    dropout: float = 0.1  # MAR's attn/proj dropout; off in every rollout and replay (`deterministic`)
    pos_embed_size: int = 256  # image size the positional embeddings were learned at (16x16 grid)
    image_size: int = 512  # generation size (Harmon's text2image default): 32x32 = 1024 tokens
    patch_size: int = 1  # latent pixels per token side
    # DiffLoss head (SimpleMLPAdaLN)
    head_width: int = 1536
    head_depth: int = 12
    # KL-16 VAE (LDM AutoencoderKL, ch 128, ch_mult (1, 1, 2, 2, 4), attention at the lowest level)
    vae_channels: tuple[int, ...] = (128, 128, 256, 256, 512)
    vae_layers_per_block: int = 2
    vae_latent_channels: int = 16
    vae_norm_groups: int = 32
    vae_scale: float = 0.2325  # latent scale factor (Harmon's vae_scale, MAR's KL-16 value)
    # prompts (Harmon's prompt_template INSTRUCTION and scripts/text2image.py)
    prompt_template: str = "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n"
    generation_template: str = "Generate an image: {text}"
    null_prompt: str = "Generate an image."
    # file names of the checkpoint folder
    weights_name: str = "harmon_1.5b.pth"
    vae_name: str = "kl16.ckpt"
    llm_dir: str = "Qwen2.5-1.5B-Instruct"

    def __post_init__(self):
        self.vae_channels = tuple(self.vae_channels)
        for name in ("image_size", "pos_embed_size"):
            if getattr(self, name) % (self.vae_stride * self.patch_size):
                raise ValueError(f"{name}={getattr(self, name)} is not a multiple of the token stride "
                                 f"{self.vae_stride * self.patch_size} (VAE stride x patch_size)")
        if self.encoder_width % self.encoder_heads or self.decoder_width % self.decoder_heads:
            raise ValueError("encoder_width / decoder_width must be divisible by their number of heads")
        if self.buffer_size < 1:
            raise ValueError("buffer_size must be >= 1: the buffers carry the LLM's summary of the prompt")
        if any(c % self.vae_norm_groups for c in self.vae_channels):
            raise ValueError(f"every vae_channels entry must be divisible by vae_norm_groups={self.vae_norm_groups}")
        if "{input}" not in self.prompt_template or "{text}" not in self.generation_template:
            raise ValueError("prompt_template needs an {input} field and generation_template a {text} field")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"Unknown attn_implementation: {self.attn_implementation!r}; expected 'sdpa' or 'eager'")

    @classmethod
    def full_size(cls) -> HarmonConfig:
        """Harmon-1.5B: Qwen2.5-1.5B-Instruct + MAR-H + KL-16, generating at 512 px."""
        return cls()

    @property
    def vae_stride(self) -> int:
        return 2 ** (len(self.vae_channels) - 1)

    @property
    def grid(self) -> int:
        return self.image_size // (self.vae_stride * self.patch_size)

    @property
    def pos_grid(self) -> int:
        return self.pos_embed_size // (self.vae_stride * self.patch_size)

    @property
    def token_dim(self) -> int:
        return self.vae_latent_channels * self.patch_size**2


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
        for lin in [b.adaLN_modulation[-1] for b in self.res_blocks] + [self.final_layer.adaLN_modulation[-1], self.final_layer.linear]:
            nn.init.zeros_(lin.weight), nn.init.zeros_(lin.bias)  # adaLN-zero

    def forward(self, x: Tensor, t: Tensor, z: Tensor) -> Tensor:
        h = self.input_proj(x.to(self.input_proj.weight.dtype))
        c = self.time_embed(t) + self.cond_embed(z.to(self.cond_embed.weight.dtype))  # [N, width]
        for block in self.res_blocks:
            h = block(h, c)
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

    def __init__(self, c: HarmonConfig):
        super().__init__()
        self.buffer_size, self.pos_grid = c.buffer_size, c.pos_grid
        We, Wd, n_pos = c.encoder_width, c.decoder_width, c.pos_grid**2
        self.class_emb = nn.Embedding(c.num_classes, We)
        self.fake_latent = nn.Parameter(torch.zeros(1, We))  # the buffers' content (MAR's unconditional class)
        self.z_proj = nn.Linear(c.token_dim, We)
        self.z_proj_ln = nn.LayerNorm(We, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, c.buffer_size + n_pos, We))
        self.encoder_blocks = nn.ModuleList(Block(We, c.encoder_heads, c.mlp_ratio, c.dropout) for _ in range(c.encoder_depth))
        self.encoder_norm = nn.LayerNorm(We, eps=1e-6)
        self.decoder_embed = nn.Linear(We, Wd)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, Wd))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, c.buffer_size + n_pos, Wd))
        self.decoder_blocks = nn.ModuleList(Block(Wd, c.decoder_heads, c.mlp_ratio, c.dropout) for _ in range(c.decoder_depth))
        self.decoder_norm = nn.LayerNorm(Wd, eps=1e-6)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, n_pos, Wd))
        for m in self.modules():  # MAR's init (checkpoints overwrite it; tests use it)
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight), nn.init.zeros_(m.bias)
        for p in (self.class_emb.weight, self.fake_latent, self.mask_token, self.encoder_pos_embed_learned,
                  self.decoder_pos_embed_learned, self.diffusion_pos_embed_learned):
            nn.init.normal_(p, std=0.02)
        self.diffloss = DiffLoss(c.token_dim, Wd, c.head_width, c.head_depth)

    def encode(self, x: Tensor, idx: Tensor, grid: int) -> Tensor:
        """Known tokens x [B, n, D] at raster positions idx [B, n] -> [B, buffer + n, We], buffers first."""
        B, nb = x.shape[0], self.buffer_size
        pe = resize_pos_embed(self.encoder_pos_embed_learned, nb, self.pos_grid, grid)[0]  # [nb + L, We]
        h = self.z_proj(x.to(self.z_proj.weight.dtype)) + pe[nb:][idx]  # [B, n, We]
        buffers = (self.fake_latent + pe[:nb]).expand(B, -1, -1)  # [B, nb, We]
        h = self.z_proj_ln(torch.cat([buffers.to(h.dtype), h], dim=1))
        for block in self.encoder_blocks:
            h = block(h)
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
            tokens = torch.where(known[..., None], packed.gather(1, slot[..., None].expand(-1, -1, x.shape[-1])), mask_token)
        x = torch.cat([buffers, tokens], dim=1) + resize_pos_embed(self.decoder_pos_embed_learned, nb, self.pos_grid, grid)
        for block in self.decoder_blocks:
            x = block(x)
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
        up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=c.vae_channels,
        layers_per_block=c.vae_layers_per_block, latent_channels=c.vae_latent_channels,
        norm_num_groups=c.vae_norm_groups, sample_size=c.image_size, scaling_factor=c.vae_scale, force_upcast=False,
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
_VAE_LEAVES = {"conv_shortcut": "nin_shortcut", "group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


def vae_key_to_ldm(name: str, levels: int) -> str:
    """A diffusers AutoencoderKL parameter name -> its name in an LDM/MAR KL checkpoint."""
    for pattern, ldm in _VAE_RULES:
        m = re.match(pattern, name)
        if m:
            name = ldm(m, levels) + name[m.end():]
            break
    prefix, _, leaf = name.rpartition(".")  # leaf = weight / bias
    for new, old in _VAE_LEAVES.items():
        if prefix.endswith("." + new):
            prefix = prefix[: -len(new)] + old
    return f"{prefix}.{leaf}"


# ----------------------------------------------------------------------------------------------


class HarmonPolicy(MARPolicy):
    """Harmon-1.5B behind the MAR policy interface. Module names match the checkpoint:
    `llm` (Qwen2ForCausalLM), `mar`, `proj_in`, `proj_out`, and the frozen `vae`."""

    head_type = "ddpm"

    def __init__(self, config: HarmonConfig, tokenizer: PreTrainedTokenizerBase | None = None):
        super().__init__()
        c = self.config = config
        self.seq_len, self.token_dim, self.z_dim = c.grid**2, c.token_dim, c.decoder_width
        self.null_prompt = c.null_prompt
        self.tokenizer = tokenizer
        if tokenizer is not None:  # Harmon pads on the right; pads are masked out of every attention
            tokenizer.padding_side = "right"
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
        llm_config = Qwen2Config.from_dict(c.llm)
        llm_config._attn_implementation = c.attn_implementation
        self.llm = Qwen2ForCausalLM(llm_config)
        self.mar = MAR(c)
        hidden = llm_config.hidden_size
        self.proj_in = build_mlp(c.encoder_width, hidden, hidden)
        self.proj_out = build_mlp(hidden, hidden, c.encoder_width)
        self.vae = build_vae(c).requires_grad_(False)

    # --- conditioning ---------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> TextCondition:
        """The chat-templated "Generate an image: {prompt}" as LLM input embeddings [B, Lt, hidden]."""
        return self._embed([self.config.generation_template.format(text=p) for p in prompts])

    def null_condition(self, batch: int) -> TextCondition:
        """Harmon's CFG branch: the bare message "Generate an image." in the same chat turn."""
        return self._embed([self.null_prompt] * batch)

    def _embed(self, messages: list[str]) -> TextCondition:
        if self.tokenizer is None:
            raise ValueError("HarmonPolicy was built without a tokenizer; load it with from_pretrained or pass one")
        texts = [self.config.prompt_template.format(input=m) for m in messages]
        batch = self.tokenizer(texts, padding=True, return_tensors="pt")
        ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        return TextCondition(self.llm.get_input_embeddings()(ids), mask.bool())

    # --- AR model -------------------------------------------------------------------------------
    def ar_forward(self, tokens: Tensor, known_mask: Tensor, cond: TextCondition) -> Tensor:
        """z [B, L, Wd]: one pass per number of known tokens (see the module docstring)."""
        counts = known_mask.sum(1)  # [B]
        groups = [(counts == n).nonzero(as_tuple=True)[0] for n in counts.unique().tolist()]
        if len(groups) == 1:
            return self._ar_pass(tokens, known_mask, cond)
        z = torch.cat([self._ar_pass(tokens[g], known_mask[g], cond.index(g)) for g in groups])
        return z[torch.argsort(torch.cat(groups))]  # back to the input's row order

    def _ar_pass(self, tokens: Tensor, known_mask: Tensor, cond: TextCondition) -> Tensor:
        """Rows that all know the same number n of tokens."""
        B, L, D = tokens.shape
        nb, grid = self.config.buffer_size, self.config.grid
        # 1. the known tokens in raster order (Harmon drops the unknown ones)
        perm = torch.argsort((~known_mask).to(torch.uint8), dim=1, stable=True)  # [B, L], known positions first
        idx = perm[:, : int(known_mask[0].sum())]  # [B, n]
        x = tokens.gather(1, idx[..., None].expand(-1, -1, D))
        # 2. MAR encoder over [buffers, known tokens]
        h = self.mar.encode(x, idx, grid)  # [B, nb + n, We]
        # 3. LLM over [prompt, known tokens, buffers]: causal, so the buffers go last to see every token
        v = self.proj_in(h)
        seq = torch.cat([cond.hidden.to(v.dtype), v[:, nb:], v[:, :nb]], dim=1)
        attn = torch.cat([cond.mask, cond.mask.new_ones(B, v.shape[1])], dim=1)  # [B, Lt + n + nb]
        position_ids = (attn.long().cumsum(1) - 1).clamp(min=0)  # prompt padding takes no position
        out = self.llm.model(inputs_embeds=seq, attention_mask=attn, position_ids=position_ids, use_cache=False).last_hidden_state
        out = out[:, cond.hidden.shape[1]:]
        out = torch.cat([out[:, -nb:], out[:, :-nb]], dim=1)  # buffers back in front: [B, nb + n, hidden]
        # 4. residual back into MAR's width, then the decoder over all L positions
        return self.mar.decode(h + self.proj_out(out), perm, known_mask, grid)  # z [B, L, Wd]

    def head(self, x_t: Tensor, t: Tensor, z: Tensor) -> Tensor:
        """[eps, variance values] [N, 2D] of MAR's DiffLoss MLP at original timesteps t [N]."""
        return self.mar.diffloss.net(x_t, t, z)

    # --- codec: KL-16 latents, one token per latent pixel (patch_size 1) --------------------------
    def encode(self, images: Tensor) -> Tensor:
        """Images [B, 3, H, W] in [0, 1] -> posterior mean x vae_scale, as tokens [B, L, D] in raster order."""
        vae = self.vae
        latent = vae.encode((images * 2 - 1).to(vae.dtype)).latent_dist.mode() * self.config.vae_scale  # [B, C, h, w]
        p, g = self.config.patch_size, self.config.grid
        x = latent.reshape(-1, latent.shape[1], g, p, g, p).permute(0, 2, 4, 1, 3, 5)  # [B, g, g, C, p, p]
        return x.reshape(-1, g * g, self.token_dim)

    def decode(self, tokens: Tensor) -> Tensor:
        p, g = self.config.patch_size, self.config.grid
        C = self.config.vae_latent_channels
        latent = tokens.reshape(-1, g, g, C, p, p).permute(0, 3, 1, 4, 2, 5).reshape(-1, C, g * p, g * p)
        images = self.vae.decode((latent / self.config.vae_scale).to(self.vae.dtype)).sample
        return ((images.float() + 1) / 2).clamp(0, 1)

    @property
    def token_grid(self) -> tuple[int, int]:
        return (self.config.grid, self.config.grid)

    def make_sampler(self, num_steps: int, noise_level: float = 0.7) -> Sampler:
        """MAR's DDPM (cosine, eps, learned-range variance) respaced to num_steps; noise_level is flow-only."""
        return DDPMSampler(HEAD_PROCESS, num_steps=num_steps)

    # --- parameter groups ---------------------------------------------------------------------------
    def ar_parameters(self) -> Iterator[nn.Parameter]:
        """LLM, MAR encoder/decoder and the projectors: everything but the head and the frozen VAE."""
        return (p for n, p in self.named_parameters() if not n.startswith(("mar.diffloss.", "vae.")))

    def head_parameters(self) -> Iterator[nn.Parameter]:
        return self.mar.diffloss.parameters()

    # --- checkpoints --------------------------------------------------------------------------------
    def harmon_state_dict(self) -> dict[str, Tensor]:
        """The state dict of Harmon's own weights file (`harmon_1.5b.pth`): everything but the VAE."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("vae.")}

    def vae_state_dict_ldm(self) -> dict[str, Tensor]:
        """The VAE's state dict under kl16.ckpt's LDM names (attention projections as 1x1 convs)."""
        levels = len(self.config.vae_channels)
        out = {}
        for k, v in self.vae.state_dict().items():
            if ".attentions." in k and k.endswith("weight") and v.dim() == 2:
                v = v[..., None, None]
            out[vae_key_to_ldm(k, levels)] = v
        return out

    def save_pretrained(self, directory: str | Path) -> None:
        """Write the checkpoint folder described in the module docstring (each file atomically)."""
        d, c = Path(directory), self.config
        cpu = lambda sd: {k: v.detach().cpu().contiguous() for k, v in sd.items()}  # noqa: E731
        with atomic_path(d / c.weights_name) as tmp:
            torch.save(cpu(self.harmon_state_dict()), tmp)
        with atomic_path(d / c.vae_name) as tmp:
            torch.save({"model": cpu(self.vae_state_dict_ldm())}, tmp)
        llm_dir = d / c.llm_dir
        llm_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(llm_dir / "config.json", self.config.llm)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(llm_dir))
        settings = {f.name: getattr(c, f.name) for f in fields(c) if f.name != "llm"}  # the LLM's own config.json holds `llm`
        atomic_write_json(d / CONFIG, {"model_type": "harmon", **settings})

    @staticmethod
    def is_checkpoint(path: str | Path) -> bool:
        """A Harmon folder: our config.json with model_type "harmon", or (none) the published weight files."""
        d = Path(path)
        if (d / CONFIG).is_file():
            try:
                raw = json.loads((d / CONFIG).read_text())
            except ValueError:
                return False
            return isinstance(raw, dict) and raw.get("model_type") == "harmon"
        return any((d / name).is_file() for name in (HarmonConfig.weights_name, HarmonConfig.vae_name))

    @classmethod
    def from_pretrained(cls, local_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> HarmonPolicy:
        """Load the checkpoint folder described in the module docstring; nothing is downloaded.

        Missing files raise FileNotFoundError naming every expected path; unreadable files and
        key mismatches raise ValueError naming the file. dtype None keeps float32.
        """
        # 1. the folder: our config.json (or Harmon-1.5B defaults), every expected file, the LLM's config
        d = Path(local_dir)
        config = _read_config(d)
        expected = [d / config.weights_name, d / config.vae_name] + [d / config.llm_dir / f for f in LLM_FILES]
        missing = [str(p) for p in expected if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"{d}: not a complete Harmon checkpoint folder; missing {', '.join(missing)} "
                                    f"(expected {config.weights_name}, {config.vae_name} and {config.llm_dir}/{{{', '.join(LLM_FILES)}}})")
        llm_config = d / config.llm_dir / "config.json"
        config.llm = _read_json(llm_config)
        if config.llm.get("model_type") != "qwen2":
            raise ValueError(f"{llm_config}: model_type is {config.llm.get('model_type')!r}, expected 'qwen2' (Qwen2.5)")
        # 2. tokenizer and the randomly initialised model
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(d / config.llm_dir), trust_remote_code=False)
        except Exception as err:
            raise ValueError(f"{d / config.llm_dir}: unreadable tokenizer ({err})") from err
        with torch.device(device):
            model = cls(config, tokenizer)
        # 3. Harmon's weights; a tied lm_head may be stored once (as embed_tokens)
        harmon = _torch_load(d / config.weights_name)
        if isinstance(harmon.get("state_dict"), dict):  # a training checkpoint wrapping the weights
            harmon = harmon["state_dict"]
        if model.llm.config.tie_word_embeddings and "llm.model.embed_tokens.weight" in harmon:
            harmon.setdefault("llm.lm_head.weight", harmon["llm.model.embed_tokens.weight"])
        _check_keys(d / config.weights_name, harmon, model.harmon_state_dict())
        # 4. the VAE under its LDM names, mapped to diffusers' (1x1 conv attention weights -> linear)
        ldm = _torch_load(d / config.vae_name)
        ldm = ldm["model"] if isinstance(ldm.get("model"), dict) else ldm
        _check_keys(d / config.vae_name, ldm, model.vae_state_dict_ldm())
        own = model.vae.state_dict()
        name = {vae_key_to_ldm(k, len(config.vae_channels)): k for k in own}
        vae = {f"vae.{name[k]}": v.reshape(own[name[k]].shape) for k, v in ldm.items()}
        model.load_state_dict({**harmon, **vae}, strict=True)
        return model.to(dtype=dtype).eval() if dtype is not None else model.eval()


def _read_json(path: Path) -> dict:
    from margrpo.io import InputError

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: unreadable JSON ({err})") from err


def _read_config(d: Path) -> HarmonConfig:
    """config.json if present (ours), else the Harmon-1.5B defaults (a folder of the published files)."""
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: no such checkpoint folder (expected harmon_1.5b.pth, kl16.ckpt, Qwen2.5-1.5B-Instruct/)")
    if not (d / CONFIG).exists():
        return HarmonConfig()
    raw = _read_json(d / CONFIG)
    if raw.pop("model_type", None) != "harmon":
        raise ValueError(f"{d / CONFIG}: model_type is not 'harmon'")
    if "mar" in raw and "auto_map" in raw:
        raise ValueError(f"{d}: this is the transformers-format wusize/Harmon-1_5B folder (remote code), which is not "
                         "supported; use the files of huggingface.co/wusize/harmon in the layout of margrpo.policy.harmon")
    known = {f.name for f in fields(HarmonConfig)} - {"llm"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{d / CONFIG}: unknown HarmonConfig fields {unknown}")
    return HarmonConfig(**raw)


def _torch_load(path: Path) -> dict:
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # zip / pickle errors of a truncated or foreign file
        raise ValueError(f"{path}: corrupt or unreadable weights ({type(err).__name__}: {err})") from err
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a state dict, got {type(obj).__name__}")
    return obj


def _check_keys(path: Path, found: dict, expected: dict[str, Tensor], show: int = 5) -> None:
    """Strict key and shape check with a readable message (the first few offenders of each kind)."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = [f"{k}: {tuple(getattr(found[k], 'shape', ()))} instead of {tuple(expected[k].shape)}"
              for k in sorted(set(found) & set(expected))
              if not isinstance(found[k], Tensor) or found[k].shape != expected[k].shape]
    if missing or unexpected or shapes:
        parts = [f"{len(v)} {name}: {v[:show]}" for name, v in
                 (("missing", missing), ("unexpected", unexpected), ("with wrong shapes", shapes)) if v]
        raise ValueError(f"{path}: does not match the model ({'; '.join(parts)}); is the HarmonConfig right for this checkpoint?")


__all__ = ["HarmonConfig", "HarmonPolicy", "QWEN2_5_1_5B_INSTRUCT", "build_vae", "vae_key_to_ldm"]
