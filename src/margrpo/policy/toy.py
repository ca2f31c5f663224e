"""The toy MAR policy: text-conditioned bidirectional transformer + SimpleMLPAdaLN head on pixel patches.

Codec choice: pixel patches (8x8x3 = 192 channels, 16 tokens at 32 px). They are exact (nothing to
train, nothing lost before the reward sees the image) and, with ShapesWorld objects aligned to the
token grid, an object is a small block of whole tokens — the learnability lever that a learned
codec would otherwise have to provide.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from margrpo.diffusion import DDPMSampler, FlowSDESampler, OneStepSampler, Sampler
from margrpo.infra.files import (
    InputError,
    atomic_write_text,
    read_json,
    record_checksums,
    save_safetensors,
    state_mismatch,
    verify_checksums,
)
from margrpo.policy.base import MARPolicy, TextCondition
from margrpo.policy.checkpointing import run_blocks
from margrpo.policy.codec import PatchPCA, from_patches, to_patches
from margrpo.policy.layers import Block, SimpleMLPAdaLN, TextEncoder
from margrpo.policy.text import SPECIAL_TOKENS, WordTokenizer, build_tokenizer  # noqa: F401  (re-exported)

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer"


@dataclass
class ToyMARConfig:
    head_type: str = "flow"  # "flow" (NOVA-like, velocity) or "ddpm" (Harmon-like, eps + learned-range variance)
    image_size: int = 64
    patch_size: int = 16  # 16 -> 4x4 = 16 tokens of 768 channels at 64 px: one token per ShapesWorld grid cell
    width: int = 192  # AR transformer width (= z_dim)
    depth: int = 4
    heads: int = 6
    mlp_ratio: float = 4.0
    # The head is light, as NOVA's and Harmon's (5-6% of AR + head): 64 x 2 blocks hold 9% of the toy's,
    # 43% of a rollout's FLOPs at K = 8, T = 20 (NOVA 54%), benchmarks/policy_cost.py; docs/toy-world.md
    head_width: int = 64
    head_depth: int = 2
    text_width: int = 64
    text_depth: int = 2
    text_heads: int = 4
    max_text_len: int = 24
    dropout: float = 0.0  # pre-training regulariser; every rollout and replay runs with dropout off
    ddpm_variance: str = "learned_range"
    head_prediction: str = "x0"  # the MLP predicts the clean token; head() converts it to the sampler's v / eps
    flow_train_time: str = "uniform"  # training-time distribution of the flow head ("uniform" or "logit_normal")
    head_z_input: bool = True  # z also enters the head's input (faster to train than AdaLN alone)
    pooled_text: bool = False  # also add the mean text embedding to every image position (class-token style)
    token_norm: tuple[float, float] = (
        0.0,
        1.0,
    )  # (mean, std) of pixel-patch values in [-1, 1]; tokens are standardised
    vocab: list[str] = field(default_factory=list)  # prompt words; the tokenizer maps others to [UNK]
    # "native": the head is a denoiser for head_type's multi-step sampler. "one_step": the head is a
    # one-step generator (a MARVAL student, margrpo.related.marval) whose MLP output at model time 1000 is the
    # token itself; its sampler is OneStepSampler, x = g(eps_0, z) + one_step_std * eps.
    head_sampler: str = "native"
    one_step_std: float = 0.05  # std of the one-step Gaussian (token units): exploration noise and exact log-prob
    # 0: tokens are the standardised pixel patches (3 p p channels). C > 0: tokens are C-channel latents of a
    # frozen PCA codec of the patches (policy.codec, fitted on the world's renders before pre-training)
    latent_channels: int = 0

    def __post_init__(self):
        if self.head_type not in ("flow", "ddpm"):
            raise ValueError(f"Unknown head_type: {self.head_type!r}; expected 'flow' or 'ddpm'")
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.head_prediction not in ("x0", "native"):
            raise ValueError(f"Unknown head_prediction: {self.head_prediction!r}; expected 'x0' or 'native'")
        if self.head_sampler not in ("native", "one_step"):
            raise ValueError(f"Unknown head_sampler: {self.head_sampler!r}; expected 'native' or 'one_step'")
        if not 0 <= self.latent_channels <= 3 * self.patch_size**2:
            raise ValueError(f"latent_channels must lie in 0..{3 * self.patch_size**2}, got {self.latent_channels}")
        if self.width % self.heads or self.text_width % self.text_heads:
            raise ValueError("width must be divisible by heads and text_width by text_heads")

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size


class ToyMAR(MARPolicy):
    def __init__(self, config: ToyMARConfig, tokenizer: WordTokenizer | None = None):
        super().__init__()
        c = self.config = config
        self.tokenizer = tokenizer or build_tokenizer(c.vocab)
        self.head_type = c.head_type
        pixels = 3 * c.patch_size**2
        self.seq_len, self.token_dim, self.z_dim = c.grid**2, c.latent_channels or pixels, c.width
        self.codec = PatchPCA(pixels, c.latent_channels) if c.latent_channels else None
        out_factor = 2 if (c.head_type == "ddpm" and c.ddpm_variance == "learned_range") else 1
        self.text_encoder = text_encoder(len(self.tokenizer), c)
        self.text_proj = nn.Linear(c.text_width, c.width)
        self.token_proj = nn.Linear(self.token_dim, c.width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, c.width))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.seq_len, c.width))
        self.text_type = nn.Parameter(torch.zeros(1, 1, c.width))
        self.blocks = nn.ModuleList(Block(c.width, c.heads, c.mlp_ratio, c.dropout) for _ in range(c.depth))
        self.norm = nn.LayerNorm(c.width)
        self.diffloss = SimpleMLPAdaLN(
            self.token_dim, c.width, c.head_width, c.head_depth, self.token_dim * out_factor, c.head_z_input
        )
        for p in (self.mask_token, self.pos_embed, self.text_type):
            nn.init.normal_(p, std=0.02)
        if c.head_type == "ddpm":  # the training schedule, to convert x0 to eps at the original timestep
            self.register_buffer(
                "alphas_cumprod",
                DDPMSampler(variance=c.ddpm_variance).train_process.alphas_cumprod.float(),
                persistent=False,
            )

    # --- conditioning ---------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> TextCondition:
        return encode_text(self.text_encoder, self.tokenizer, prompts, self.config.max_text_len, self.device)

    # --- AR model -------------------------------------------------------------------------------
    def ar_forward(self, tokens: Tensor, known_mask: Tensor, cond: TextCondition) -> Tensor:
        B, L, _ = tokens.shape
        x = torch.where(known_mask[..., None], self.token_proj(tokens), self.mask_token.to(tokens.dtype))  # [B, L, W]
        x = x + self.pos_embed
        text = self.text_proj(cond.hidden) + self.text_type  # [B, Lt, W]
        if self.config.pooled_text:
            w = cond.mask[..., None].to(text.dtype)
            x = x + ((text * w).sum(1) / w.sum(1).clamp(min=1))[:, None].to(x.dtype)  # [B, 1, W]
        h = torch.cat([text.to(x.dtype), x], dim=1)  # [B, Lt + L, W]
        key_mask = torch.cat([cond.mask, torch.ones(B, L, dtype=torch.bool, device=x.device)], dim=1)
        h = run_blocks(self.blocks, h, key_mask, checkpointing=self.gradient_checkpointing)
        return self.norm(h[:, -L:])  # z [B, L, W]

    lora_scope, lora_targets = r"blocks\.\d+\.", ("qkv", "proj", "mlp.0", "mlp.3")

    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        """The transformer's blocks and the head's residual blocks."""
        self.gradient_checkpointing = self.diffloss.gradient_checkpointing = enabled

    def head(self, x_t: Tensor, t: Tensor, z: Tensor) -> Tensor:
        """The sampler's native output (flow: velocity; DDPM: eps [+ variance]) for noisy tokens x_t [N, D].

        With `head_prediction="x0"` the MLP predicts the clean token and the noise part is carried
        analytically from x_t: an MLP narrower than the token (192-768 channels) cannot copy the
        noise through itself, but it can draw the clean patch, which has few degrees of freedom.
        """
        if self.config.head_sampler == "one_step" and not bool(t.any()):
            return x_t  # only OneStepSampler's hold steps (model time 0): their output is unused, skip the MLP
        out = self.diffloss(x_t, t, z)
        if self.config.head_prediction == "native" or self.config.head_sampler == "one_step":
            return out
        D = self.token_dim
        x0, rest = out[:, :D].float(), out[:, D:].float()  # the conversion divides by small numbers: float32
        x_t = x_t.float()
        if self.head_type == "flow":  # x_t = (1 - s) x0 + s eps, v = eps - x0 = (x_t - x0) / s, s = t / 1000
            s = (t.float() / 1000).clamp(min=1e-3)[:, None]
            native = (x_t - x0) / s
        else:  # x_t = sqrt(abar) x0 + sqrt(1 - abar) eps
            abar = self.alphas_cumprod[t.round().long().clamp(0, len(self.alphas_cumprod) - 1)][:, None]
            native = (x_t - abar.sqrt() * x0) / (1 - abar).clamp(min=1e-6).sqrt()
        return torch.cat([native, rest], dim=-1)

    def loss_weight(self, t: Tensor) -> Tensor:
        """Per-row weight on the sampler's native loss for x0 prediction (flow: exactly the x0 MSE)."""
        if self.config.head_prediction == "native":
            return torch.ones_like(t, dtype=torch.float32)
        if self.head_type == "flow":
            return (t.float() / 1000).clamp(min=1e-3) ** 2
        # eps-MSE * (1 - abar) / abar is the x0 MSE; capped at 1 (min-SNR weighting): near pure noise
        # abar ~ 1e-9 and the uncapped weight would swamp every other timestep
        abar = self.alphas_cumprod[t.round().long().clamp(0, len(self.alphas_cumprod) - 1)].float()
        return ((1 - abar) / abar).clamp(max=1.0)

    # --- codec: pixel patches, or their frozen PCA latents ------------------------------------------
    def encode(self, images: Tensor) -> Tensor:
        x = to_patches(images * 2 - 1, self.config.patch_size)  # [B, L, 3 p p] in [-1, 1]
        if self.codec is not None:
            return self.codec.encode(x)
        mean, std = self.config.token_norm
        return (x - mean) / std

    def decode(self, tokens: Tensor) -> Tensor:
        if self.codec is not None:
            x = self.codec.decode(tokens)
        else:
            mean, std = self.config.token_norm
            x = tokens.float() * std + mean
        return (from_patches(x, self.config.grid, self.config.patch_size).clamp(-1, 1) + 1) / 2

    def fit_codec(self, images: Tensor) -> float:
        """Fit the latent codec on images [N, 3, H, W] in [0, 1] (the world's renders): the variance kept."""
        if self.codec is None:
            raise ValueError("this toy policy has pixel tokens (latent_channels 0): there is no codec to fit")
        return self.codec.fit(to_patches(images * 2 - 1, self.config.patch_size))

    @property
    def token_grid(self) -> tuple[int, int]:
        return (self.config.grid, self.config.grid)

    def make_sampler(self, num_steps: int, noise_level: float = 0.7) -> Sampler:
        if self.config.head_sampler == "one_step":  # noise_level is the SDE's; the one-step std is the policy's own
            return OneStepSampler(num_steps=num_steps, std=self.config.one_step_std)
        if self.head_type == "flow":
            return FlowSDESampler(
                num_steps=num_steps, noise_level=noise_level, train_time_sampling=self.config.flow_train_time
            )
        return DDPMSampler(num_steps=num_steps, variance=self.config.ddpm_variance)

    # --- parameter groups ---------------------------------------------------------------------------
    def ar_parameters(self) -> Iterator[nn.Parameter]:
        """The MAR transformer (and its text projection): everything but the head and the text encoder.

        The text encoder is trained in pre-training only and frozen in RL, as NOVA's Phi and Harmon's
        LLM are (MAR-GRPO's official Harmon run trains `mar.*` alone). Measured on the toy: with it
        trainable, 83% of the policy gradient's squared norm sat in its (then BERT) embeddings, and Adam's
        per-parameter steps on every prompt word drifted the validation reward down.
        """
        return (p for n, p in self.named_parameters() if not n.startswith(("diffloss.", "text_encoder.")))

    def head_parameters(self) -> Iterator[nn.Parameter]:
        return self.diffloss.parameters()

    # --- Hugging Face style persistence ---------------------------------------------------------------
    def save_pretrained(self, directory: str | Path) -> None:
        save_folder(self, "toy-mar", directory)

    @classmethod
    def from_pretrained(cls, directory: str | Path, device: str | torch.device = "cpu") -> ToyMAR:
        raw = read_folder_config(directory, "toy-mar")
        if "token_norm" in raw:
            raw["token_norm"] = tuple(raw["token_norm"])
        return load_folder(cls, ToyMARConfig, raw, directory).to(device)


def save_folder(model: nn.Module, model_type: str, directory: str | Path) -> None:
    """A toy policy's folder: weights (safetensors), config.json (with its model_type) and the tokenizer, each
    file's sha256 in checksums.json (checked on load)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_safetensors(state, d / WEIGHTS)
    atomic_write_text(d / CONFIG, json.dumps({"model_type": model_type, **asdict(model.config)}, indent=1))
    model.tokenizer.save_pretrained(str(d / TOKENIZER))
    record_checksums(d)


def read_folder_config(directory: str | Path, model_type: str) -> dict:
    """config.json of a toy policy folder (its model_type checked and removed); errors name the file."""
    d = Path(directory)
    missing = [n for n in (CONFIG, WEIGHTS, TOKENIZER) if not (d / n).exists()]
    if missing:
        raise FileNotFoundError(
            f"{d}: not a {model_type} checkpoint; missing {', '.join(missing)} "
            f"(expected {CONFIG}, {WEIGHTS}, {TOKENIZER}/)"
        )
    verify_checksums(d)
    raw = read_json(d / CONFIG)
    if not isinstance(raw, dict) or raw.pop("model_type", None) != model_type:
        raise InputError(f"{d / CONFIG}: model_type is not {model_type!r}")
    return raw


def load_folder(cls, config_cls, raw: dict, directory: str | Path):
    """`cls(config_cls(**raw), tokenizer)` with the folder's weights loaded strictly; bad fields and corrupt
    weights name their file."""
    d = Path(directory)
    try:
        config = config_cls(**raw)
    except (TypeError, ValueError) as err:
        raise InputError(f"{d / CONFIG}: {err}") from None
    model = cls(config, WordTokenizer.from_pretrained(d / TOKENIZER))
    try:
        state = load_file(str(d / WEIGHTS))
    except Exception as err:  # safetensors raises its own error types for truncated files
        raise ValueError(f"{d / WEIGHTS}: corrupt or unreadable weights ({err})") from err
    check_state(state, model.state_dict(), d / WEIGHTS, d / CONFIG)
    model.load_state_dict(state, strict=True)
    return model


def check_state(state: dict, expected: dict, weights: Path, config: Path) -> None:
    """Weights whose keys and shapes are those of the model `config` describes, else one line naming both files."""
    if mismatch := state_mismatch(state, expected):
        raise InputError(f"{weights}: does not match {config}: {mismatch}")


def text_encoder(vocab_size: int, c) -> TextEncoder:
    """The toy policies' tiny prompt encoder (c: a config with text_width, text_depth, text_heads,
    max_text_len, dropout); shared by the continuous toy MAR and the discrete toy-mask policy."""
    return TextEncoder(
        vocab_size, c.text_width, c.text_depth, c.text_heads, c.max_text_len, 4.0, c.dropout, post_norm=True
    )


def encode_text(
    encoder: TextEncoder, tokenizer: WordTokenizer, prompts: list[str], max_len: int, device
) -> TextCondition:
    """Prompts -> TextCondition(hidden [B, Lt, text_width], key-padding mask [B, Lt])."""
    batch = tokenizer(prompts, max_length=max_len)
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    return TextCondition(encoder(ids, mask), mask.bool())


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def mask_ratio_sample(generator: torch.Generator, low: float = 0.7, mean: float = 1.0, std: float = 0.25) -> float:
    """MAR's training mask ratio: a normal(mean, std) truncated to [low, 1], by rejection."""
    while True:
        r = mean + std * torch.randn((), generator=generator).item()
        if low <= r <= 1.0:
            return r


def masked_count(seq_len: int, ratio: float) -> int:
    return max(1, min(seq_len, math.ceil(seq_len * ratio)))
