"""Tiny random-weight NOVA and Harmon policies (the real classes on tiny configs), shared by the tests."""

import torch
from diffusers import AutoencoderKL
from helpers import PROMPTS, VOCAB
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PhiConfig, PhiModel, PreTrainedTokenizerFast

from margrpo.policy.harmon import HarmonConfig, HarmonPolicy
from margrpo.policy.nova import NovaConfig, NovaPolicy


def tiny_nova_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level, no special tokens added: like Phi's tokenizer, the empty prompt has no tokens."""
    words = ["[PAD]", "[UNK]"] + sorted({w.lower() for w in VOCAB + " ".join(PROMPTS).split()})
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizers.Lowercase(), pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")


def tiny_nova(seed: int = 0) -> NovaPolicy:
    """64 px -> 8 x 8 x 4 latent (4 VAE levels, stride 8 as in NOVA) -> 4 x 4 = 16 tokens of 16 channels."""
    torch.manual_seed(seed)
    config = NovaConfig(
        image_size=(64, 64),
        text_token_dim=16,
        text_token_len=8,
        video_base_size=(1, 2, 2),
        image_base_size=(4, 4),
        width=32,
        num_heads=4,
        video_depth=1,
        image_depth=2,
        head_depth=2,
        head_width=32,
        flow_shift=1.5,
    )
    tokenizer = tiny_nova_tokenizer()
    phi = PhiModel(
        PhiConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=16,
            partial_rotary_factor=0.5,
        )
    )
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=64,
    )
    return NovaPolicy(config, phi, vae, tokenizer)


TINY_LLM = dict(
    model_type="qwen2",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)


def tiny_harmon_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level stand-in for Qwen's tokenizer, with its chat special tokens."""
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    words = ["[UNK]", *special, "user", "assistant", "Generate", "an", "image", ".", ":", *VOCAB, "triangles"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(dict.fromkeys(words))}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(special)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="<|endoftext|>", eos_token="<|im_end|>"
    )


def tiny_harmon_config(**overrides) -> HarmonConfig:
    """32 px through a 3-level VAE (stride 4): 8x8 = 64 tokens of 4 channels; positional embeddings
    learned on a 4x4 grid and resized, as Harmon-1.5B resizes its 16x16 ones to 32x32."""
    cfg = dict(
        llm=dict(TINY_LLM, vocab_size=len(tiny_harmon_tokenizer())),
        attn_implementation="eager",
        encoder_width=32,
        encoder_depth=1,
        encoder_heads=4,
        decoder_width=32,
        decoder_depth=1,
        decoder_heads=4,
        buffer_size=4,
        num_classes=10,
        dropout=0.1,
        pos_embed_size=16,
        image_size=32,
        head_width=32,
        head_depth=2,
        vae_channels=(8, 8, 16),
        vae_layers_per_block=1,
        vae_latent_channels=4,
        vae_norm_groups=4,
    )
    return HarmonConfig(**{**cfg, **overrides})


def tiny_harmon(seed: int = 0, **overrides) -> HarmonPolicy:
    torch.manual_seed(seed)
    policy = HarmonPolicy(tiny_harmon_config(**overrides), tiny_harmon_tokenizer())
    with torch.no_grad():  # the head starts as zero (adaLN-zero): give it an output that depends on z
        for p in policy.head_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return policy
