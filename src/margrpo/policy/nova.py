"""NOVA text-to-image (BAAI/nova-d48w1024-sd512) as a MAR policy, state-dict compatible with the release.

NOVA generates a video frame by frame (a "video encoder" ViT over [text; previous frames]) and each
frame set by set (an "image encoder" ViT doing MAR over the frame's latent tokens), and draws every
token with a small flow-matching MLP. For text-to-image there is a single frame, so the video encoder
only turns [text; BOS frame] into the frame condition c; the image encoder then maps c and the known
tokens to z, and the MLP denoises each unknown token given its z. Everything below is that one-frame
path; parts of the checkpoint only video uses are kept as parameters (frozen) so loading is strict.

Layout (NOVA's `PatchEmbed.patchify`): the 4 x 64 x 64 SD latent is cut into 2 x 2 patches, giving
L = 32 * 32 = 1024 tokens in row-major order, each of D = 2 * 2 * 4 = 16 channels ordered (dy, dx, c).
Tokens are VAE latents already scaled as NOVA scales them: (z - shift_factor) * scaling_factor.

The text encoder (Phi-2, `transformers.PhiModel`) and the VAE (`diffusers.AutoencoderKL`) are frozen
(requires_grad False) and belong to neither parameter group: GRPO trains the transformer only.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from margrpo.diffusion import FlowSDESampler, Sampler
from margrpo.policy.base import MARPolicy, TextCondition
from margrpo.policy.checkpointing import run_blocks
from margrpo.policy.layers import Attention, timestep_embedding
from margrpo.policy.nova_config import (  # noqa: F401  (re-exported: the names NOVA users import from here)
    HEADS_BY_WIDTH,
    TEXT_POSITIONS,
    TRANSFORMER_WEIGHTS,
    NovaConfig,
    _pair,
)


def sincos_2d(dim: int, h: int, w: int) -> Tensor:
    """Fixed position code [h * w, dim], row-major: [sin(x f), cos(x f), sin(y f), cos(y f)] (NOVA's PosEmbed)."""
    freq = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    y, x = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    fx, fy = x.reshape(-1, 1) * freq, y.reshape(-1, 1) * freq
    return torch.cat([fx.sin(), fx.cos(), fy.sin(), fy.cos()], dim=-1)


# --- the transformer ------------------------------------------------------------------------------
class PatchEmbed(nn.Module):
    """A p x p stride-p convolution (kept as Conv2d for the checkpoint) applied to patchified tokens."""

    def __init__(self, in_dim: int, out_dim: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(in_dim, out_dim, patch, patch)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens [..., p * p * C] in (dy, dx, c) order -> [..., out_dim]: the convolution as one matmul."""
        w = self.proj.weight.permute(0, 2, 3, 1).flatten(1)  # [out, p*p*C], (dy, dx, c) like the tokens
        return F.linear(tokens, w, self.proj.bias)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """NOVA's ViT block: LayerNorm on each branch's *output* (x + LN(attn(x)), then x + LN(mlp(x)))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        x = x + self.norm1(self.attn(x, key_mask))
        return x + self.norm2(self.mlp(x))


class ViT(nn.Module):
    """`video_encoder` / `image_encoder`: patch projection, blocks, final LayerNorm (positions are added outside)."""

    def __init__(self, depth: int, dim: int, heads: int, mlp_ratio: float, patch: int, image_dim: int):
        super().__init__()
        self.patch_embed = PatchEmbed(image_dim, dim, patch)
        self.blocks = nn.ModuleList(Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)


class TextEmbed(nn.Module):
    """Projects Phi features to the model width. `weight` is a fixed random filler (a persistent buffer in
    the checkpoint) for positions past the prompt; the empty prompt is all filler, NOVA's CFG null text."""

    def __init__(self, text_dim: int, dim: int):
        super().__init__()
        self.proj, self.norm = nn.Linear(text_dim, dim), nn.LayerNorm(dim)
        self.register_buffer("weight", torch.randn(TEXT_POSITIONS, text_dim) * 0.02)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.norm(self.proj(hidden))


class MaskEmbed(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.bos_token = nn.Parameter(torch.randn(1, dim) * 0.02)  # the frame before the first one
        self.mask_token = nn.Parameter(torch.randn(1, dim) * 0.02)  # an unknown image token


def _time_mlp(dim: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(256, dim), nn.SiLU(), nn.Linear(dim, dim))


class VideoPosEmbed(nn.Module):
    """Frame-index embedding (an MLP of a 256-d sinusoid, then LayerNorm) plus the fixed 2-D code."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm, self.time_proj = nn.LayerNorm(dim), _time_mlp(dim)

    def first_frame(self) -> Tensor:
        """[1, dim] embedding of frame 0: its sinusoid is sin(0) = 0 at 128 frequencies, cos(0) = 1 at 128."""
        w = self.time_proj[0].weight
        sincos = torch.cat([w.new_zeros(128), w.new_ones(128)])[None]
        return self.norm(self.time_proj(sincos))


class MotionEmbed(nn.Module):
    """Video-only (motion-flow and fps conditions): never used for images, present for strict loading."""

    def __init__(self, dim: int):
        super().__init__()
        self.flow_proj, self.fps_proj = _time_mlp(dim), _time_mlp(dim)


class AdaLNZero(nn.Module):
    """LayerNorm (no affine) modulated by (scale, shift[, gate]) = proj(SiLU(c))."""

    def __init__(self, dim: int, num_stats: int):
        super().__init__()
        self.proj = nn.Linear(dim, num_stats * dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.num_stats = num_stats

    def forward(self, x: Tensor, c: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        scale, shift, *rest = self.proj(F.silu(c)).chunk(self.num_stats, dim=-1)
        return self.norm(x) * (1 + scale) + shift, tuple(rest)


class Projector(nn.Module):
    def __init__(self, dim: int, hidden: int, out: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, out)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.silu(self.fc1(x)))


class DiffusionBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm1 = AdaLNZero(dim, 3)
        self.proj, self.norm2 = Projector(dim, dim, dim), nn.LayerNorm(dim)

    def forward(self, x: Tensor, c: Tensor) -> Tensor:
        h, (gate,) = self.norm1(x, c)
        return x + self.norm2(self.proj(h)) * gate


class TimeCondEmbed(nn.Module):
    def __init__(self, cond_dim: int, dim: int):
        super().__init__()
        self.timestep_proj = Projector(256, dim, dim)
        self.condition_proj = Projector(cond_dim, dim, dim)

    def forward(self, t: Tensor, z: Tensor) -> Tensor:
        return self.condition_proj(z) + self.timestep_proj(timestep_embedding(t, 256).to(z.dtype))


class DiffusionMLP(nn.Module):
    """`image_decoder`: v = MLP(x_t, t, z) for one token. Flow matching with x_t = (1 - s) x0 + s eps,
    t = 1000 s, target v = eps - x0 (NOVA's get_losses) — our FlowSDESampler's convention as is."""

    gradient_checkpointing = False  # of the diffusion blocks (policy.checkpointing)

    def __init__(self, depth: int, dim: int, cond_dim: int, patch: int, image_dim: int):
        super().__init__()
        self.patch_embed = PatchEmbed(image_dim, dim, patch)
        self.time_cond_embed = TimeCondEmbed(cond_dim, dim)
        self.blocks = nn.ModuleList(DiffusionBlock(dim) for _ in range(depth))
        self.norm = AdaLNZero(dim, 2)
        self.head = nn.Linear(dim, patch**2 * image_dim)

    def forward(self, x: Tensor, t: Tensor, z: Tensor) -> Tensor:
        """x [N, D] noisy tokens, t [N] model time in (0, 1000], z [N, cond_dim] -> velocity [N, D]."""
        c = self.time_cond_embed(t, z)
        h = run_blocks(self.blocks, self.patch_embed(x), c, checkpointing=self.gradient_checkpointing)
        return self.head(self.norm(h, c)[0])


class NovaTransformer(nn.Module):
    """NOVA's transformer; `state_dict()` has exactly the keys of transformer/diffusion_pytorch_model.safetensors."""

    gradient_checkpointing = False  # of the ViT blocks (policy.checkpointing)

    def __init__(self, config: NovaConfig):
        super().__init__()
        c, p = config, config.patch_size
        self.config = config
        self.video_encoder = ViT(c.video_depth, c.width, c.num_heads, c.mlp_ratio, 2 * p, c.image_dim)
        self.image_encoder = ViT(c.image_depth, c.width, c.num_heads, c.mlp_ratio, p, c.image_dim)
        self.image_decoder = DiffusionMLP(c.head_depth, c.head_width, c.width, p, c.image_dim)
        self.mask_embed = MaskEmbed(c.width)
        self.text_embed = TextEmbed(c.text_token_dim, c.width)
        self.video_pos_embed = VideoPosEmbed(c.width)
        if c.video_base_size[0] > 1:  # video checkpoints only (NOVA adds it when the clip has > 1 frame)
            self.motion_embed = MotionEmbed(c.width)
        self.register_buffer("video_pos", sincos_2d(c.width, *c.video_base_size[1:]), persistent=False)
        self.register_buffer("image_pos", sincos_2d(c.width, *c.image_base_size), persistent=False)
        # Frozen as in NOVA's T2I recipe (pipeline_train_t2i.configure_model): the text LayerNorm and the
        # frame-time embedding; the video patch projection and motion embedding are unused for images.
        frozen = [self.text_embed.norm, self.video_pos_embed, self.video_encoder.patch_embed]
        for m in frozen + ([self.motion_embed] if hasattr(self, "motion_embed") else []):
            m.requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return self.mask_embed.bos_token.dtype

    def frame_condition(self, text_hidden: Tensor) -> Tensor:
        """c [B, Lv, W]: the video encoder over [text; BOS frame], the condition of the (only) frame."""
        text = self.text_embed(text_hidden)  # [B, Lt, W]
        frame = self.mask_embed.bos_token + self.video_pos_embed.first_frame()  # [1, W]
        frame = (frame + self.video_pos.to(frame.dtype)).expand(text.shape[0], -1, -1)  # [B, Lv, W]
        h = torch.cat([text, frame.to(text.dtype)], dim=1)
        h = run_blocks(self.video_encoder.blocks, h, checkpointing=self.gradient_checkpointing)
        return self.video_encoder.norm(h[:, text.shape[1] :])

    def image_condition(self, tokens: Tensor, known: Tensor, c: Tensor) -> Tensor:
        """z [B, L, W] from known tokens [B, L, D] (mask [B, L]) and the frame condition c [B, Lc, W].

        NOVA's image encoder is an MAE inside one ViT: the first half of the blocks sees only c and the
        known tokens; the second half sees c and every position (unknown ones as mask_token). Rows may
        know different numbers of tokens (GRPO replays several AR steps at once), so the known tokens are
        gathered to the front and the shorter rows padded, with padding masked out of the attention keys.
        """
        enc, Lc, W = self.image_encoder, c.shape[1], c.shape[2]
        x = enc.patch_embed(tokens)  # [B, L, W]
        x = torch.where(known[..., None], x, self.mask_embed.mask_token.to(x.dtype))
        x = x + self.image_pos.to(x.dtype)
        split = len(enc.blocks) // 2
        # 1. encoder half over [c; known tokens]
        n = int(known.sum(1).max())
        order = torch.argsort((~known).to(torch.int8), dim=1, stable=True)[:, :n]  # known positions first
        valid = known.gather(1, order)  # [B, n], False = padding
        idx = order[..., None].expand(-1, -1, W)
        seen = x.gather(1, idx)
        h = torch.cat([c.to(x.dtype), seen], dim=1)
        # always masked (even when no row is padded) so rollout and replay use the same attention kernel
        key_mask = torch.cat([valid.new_ones(valid.shape[0], Lc), valid], dim=1)
        h = run_blocks(enc.blocks[:split], h, key_mask, checkpointing=self.gradient_checkpointing)
        c, h = h[:, :Lc], h[:, Lc:]
        x = x.scatter(1, idx, torch.where(valid[..., None], h, seen).to(x.dtype))
        # 2. decoder half over [c; all positions]
        h = torch.cat([c, x], dim=1)
        h = run_blocks(enc.blocks[split:], h, checkpointing=self.gradient_checkpointing)
        return enc.norm(h[:, Lc:])


# --- the policy -------------------------------------------------------------------------------------
class NovaPolicy(MARPolicy):
    """NOVA text-to-image behind the MAR policy interface (flow head, CFG null prompt "")."""

    mask_rounding = "round"  # NOVA's pipeline: num_preds from np.round of the cosine mask lengths

    head_type = "flow"
    null_prompt = ""  # NOVA's default negative prompt: Phi features of no tokens, i.e. all filler rows
    model_type = "nova"

    def __init__(self, config: NovaConfig, text_encoder: nn.Module, vae: nn.Module, tokenizer, vae_batch: int = 8):
        super().__init__()
        self.config = config
        self.transformer = NovaTransformer(config)  # first: MARPolicy.device reads the first parameter
        self.text_encoder = text_encoder.requires_grad_(False).eval()
        self.vae = vae.requires_grad_(False).eval()
        self.tokenizer = tokenizer
        if tokenizer.pad_token is None:  # padding to text_token_len needs one; its features are replaced anyway
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        tokenizer.padding_side = "right"  # NOVA keeps the first len(prompt) features
        self.vae_batch = vae_batch
        self.source_dir: Path | None = None  # the folder this policy was loaded from (its frozen parts are reused)
        rows, cols = config.image_base_size
        self.seq_len, self.token_dim, self.z_dim = rows * cols, config.token_dim, config.width
        vae_down = 2 ** (len(vae.config.block_out_channels) - 1)
        if vae_down != config.image_stride or vae.config.latent_channels != config.image_dim:
            raise ValueError(
                f"the VAE (stride {vae_down}, {vae.config.latent_channels} channels) does not match the "
                f"transformer (image_stride {config.image_stride}, image_dim {config.image_dim})"
            )

    def train(self, mode: bool = True) -> NovaPolicy:
        super().train(mode)
        self.text_encoder.eval(), self.vae.eval()  # frozen: never dropout
        return self

    # --- conditioning ---------------------------------------------------------------------------
    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> TextCondition:
        """Phi's last hidden state (after its final LayerNorm) for the prompt tokens, filler rows after.

        Padded to text_token_len as NOVA does; Phi is causal, so padding never changes the prompt's
        features and every prompt encodes the same whatever else is in the batch. The mask is all True:
        NOVA attends to all text_token_len positions.
        """
        Lt = self.config.text_token_len
        batch = self.tokenizer(
            list(prompts), padding="max_length", truncation=True, max_length=Lt, return_tensors="pt"
        )
        ids, lengths = batch["input_ids"].to(self.device), batch["attention_mask"].sum(1).to(self.device)
        filler = self.transformer.text_embed.weight[:Lt]  # [Lt, text_dim]
        hidden = self.text_encoder(input_ids=ids, use_cache=False).last_hidden_state.to(
            filler.dtype
        )  # [B, Lt, text_dim]
        prompt = torch.arange(Lt, device=ids.device)[None] < lengths[:, None]  # [B, Lt]
        hidden = torch.where(prompt[..., None], hidden, filler)
        return TextCondition(hidden, torch.ones_like(prompt))

    # --- the two halves -----------------------------------------------------------------------------
    def prepare_condition(self, cond: TextCondition) -> TextCondition:
        """The frame condition (video encoder over [text; BOS frame]) depends on the prompt alone."""
        return TextCondition(
            cond.hidden, cond.mask, self.transformer.frame_condition(cond.hidden.to(self.transformer.dtype))
        )

    def ar_forward(self, tokens: Tensor, known_mask: Tensor, cond: TextCondition) -> Tensor:
        """z [B, L, width]. cond.mask is not used: NOVA attends to all text_token_len positions."""
        dtype = self.transformer.dtype
        c = cond.context if cond.context is not None else self.transformer.frame_condition(cond.hidden.to(dtype))
        return self.transformer.image_condition(tokens.to(dtype), known_mask, c.to(dtype))

    def head(self, x_t: Tensor, t: Tensor, z: Tensor) -> Tensor:
        """Velocity v = eps - x0 at model time t = 1000 s (NOVA's native output; no conversion needed)."""
        dtype = self.transformer.dtype
        return self.transformer.image_decoder(x_t.to(dtype), t, z.to(dtype))

    # --- codec: SD VAE + 2x2 patches ------------------------------------------------------------------
    def patchify(self, latents: Tensor) -> Tensor:
        """[B, C, H, W] -> [B, (H/p)(W/p), p*p*C], row-major tokens of (dy, dx, c) channels."""
        p, C = self.config.patch_size, self.config.image_dim
        B, _, H, W = latents.shape
        x = latents.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1)
        return x.reshape(B, (H // p) * (W // p), p * p * C)

    def unpatchify(self, tokens: Tensor) -> Tensor:
        p, C = self.config.patch_size, self.config.image_dim
        (h, w), B = self.config.image_base_size, tokens.shape[0]
        x = tokens.reshape(B, h, w, p, p, C).permute(0, 5, 1, 3, 2, 4)
        return x.reshape(B, C, h * p, w * p)

    def _latent_affine(self) -> tuple[float, float]:
        return float(self.vae.config.scaling_factor), float(self.vae.config.shift_factor or 0.0)

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """Images in [0, 1] -> tokens of the posterior mean latent, scaled like NOVA: (z - shift) * scale."""
        scale, shift = self._latent_affine()
        x = (images * 2 - 1).to(self.vae.device, self.vae.dtype)
        z = torch.cat([self.vae.encode(b).latent_dist.mode() for b in x.split(self.vae_batch)])
        return self.patchify((z.float() - shift) * scale)

    @torch.no_grad()
    def decode(self, tokens: Tensor) -> Tensor:
        scale, shift = self._latent_affine()
        z = (self.unpatchify(tokens.float()) / scale + shift).to(self.vae.device, self.vae.dtype)
        x = torch.cat([self.vae.decode(b).sample for b in z.split(self.vae_batch)])
        return ((x.float() + 1) / 2).clamp(0, 1)

    @property
    def token_grid(self) -> tuple[int, int]:
        return tuple(self.config.image_base_size)

    def make_sampler(self, num_steps: int, noise_level: float = 0.7) -> Sampler:
        """NOVA's process: t = 1 noise, v = eps - x0, model time 1000 t, logit-normal training times,
        and NOVA's grid: linspace(1, 1/1000, T) shifted by flow_shift, then 0 (its Euler scheduler's)."""
        return FlowSDESampler(
            num_steps=num_steps,
            noise_level=noise_level,
            shift=self.config.flow_shift,
            train_time_sampling="logit_normal",
            t_min=1 / 1000,
        )

    # --- parameter groups ---------------------------------------------------------------------------
    def ar_parameters(self) -> Iterator[nn.Parameter]:
        """The transformer but its diffusion MLP (text encoder and VAE are frozen and in neither group)."""
        return (p for n, p in self.transformer.named_parameters() if not n.startswith("image_decoder."))

    def head_parameters(self) -> Iterator[nn.Parameter]:
        return self.transformer.image_decoder.parameters()

    lora_scope, lora_targets = r"transformer\.(?:video|image)_encoder\.blocks\.\d+\.", ("qkv", "proj", "fc1", "fc2")

    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        """The ViT blocks and the diffusion head's blocks."""
        self.gradient_checkpointing = self.transformer.gradient_checkpointing = enabled
        self.transformer.image_decoder.gradient_checkpointing = enabled

    # --- diffusers-style folder (margrpo.policy.nova_files) ------------------------------------------
    def save_pretrained(self, directory: str | Path, copy_frozen: bool = False) -> None:
        """Write the diffusers layout NOVA is published in (`nova_files.save_nova`)."""
        from margrpo.policy.nova_files import save_nova

        save_nova(self, directory, copy_frozen)

    @classmethod
    def from_pretrained(
        cls, directory: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
    ) -> NovaPolicy:
        """Load a local diffusers-style NOVA folder or a repository id from the Hugging Face cache
        (`nova_files.load_nova`; never downloads, never runs checkpoint code)."""
        from margrpo.policy.nova_files import load_nova

        return load_nova(cls, directory, device, dtype)


__all__ = ["NovaConfig", "NovaPolicy", "NovaTransformer", "sincos_2d"]
