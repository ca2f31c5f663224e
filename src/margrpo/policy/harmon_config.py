"""Harmon's sizes and file names, read by the model (`margrpo.policy.harmon`) and by its networks
(`margrpo.policy.mar_h`): a module of its own so that neither imports the other for it."""

from __future__ import annotations

from dataclasses import dataclass, field

# Qwen/Qwen2.5-1.5B-Instruct config.json (the LLM Harmon-1.5B starts from; its configs/models file)
QWEN2_5_1_5B_INSTRUCT = dict(
    model_type="qwen2",
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    hidden_act="silu",
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    use_sliding_window=False,
    sliding_window=32768,
    max_window_layers=21,
    attention_dropout=0.0,
    bos_token_id=151643,
    eos_token_id=151645,
)


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
                raise ValueError(
                    f"{name}={getattr(self, name)} is not a multiple of the token stride "
                    f"{self.vae_stride * self.patch_size} (VAE stride x patch_size)"
                )
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
