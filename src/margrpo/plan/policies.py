"""The policies the plan steps: NOVA and Harmon at full size (random weights), their narrow twins (the same depths,
sequence lengths, token dim and schedule at widths 8-32: the tape's real run), and the small / tiny ones of the
validation and `--test`."""

from __future__ import annotations

from margrpo.plan.stand_ins import stand_in_tokenizer


def _phi(hidden: int, layers: int, heads: int, vocab: int, positions: int, rotary: float):
    from transformers import PhiConfig, PhiModel

    config = PhiConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        partial_rotary_factor=rotary,
        max_position_embeddings=positions,
    )
    config._attn_implementation = "sdpa"
    return PhiModel(config)


def _sd_vae(channels: tuple[int, ...], layers: int, groups: int, size: int):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        latent_channels=4,
        block_out_channels=channels,
        layers_per_block=layers,
        norm_num_groups=groups,
        sample_size=size,
    )


def build_nova(size: str, narrow: bool):
    """NOVA at `size` (full: nova-d48w1024-sd512 with Phi-2 and the SD VAE; small: memory_levers.py's; tiny: the
    tests'); `narrow`: the same depths, lengths and token dim at widths 8-32."""
    from margrpo.policy.nova import NovaConfig, NovaPolicy

    if size == "full":
        wide = dict(width=1024, num_heads=16, head_width=1280, text_token_dim=2560)
        config = NovaConfig(**(dict(width=16, num_heads=2, head_width=8, text_token_dim=16) if narrow else wide))
        phi = _phi(16, 32, 2, 51200, 2048, 0.5) if narrow else _phi(2560, 32, 32, 51200, 2048, 0.4)
        vae = _sd_vae((8,) * 4 if narrow else (128, 256, 512, 512), 2, 4 if narrow else 32, 512)
    else:
        px, width, depth = (128, 128, 4) if size == "small" else (64, 32, 2)
        grid = px // 16
        config = NovaConfig(
            image_size=(px, px),
            text_token_dim=16,
            text_token_len=8,
            video_base_size=(1, grid // 2, grid // 2),
            image_base_size=(grid, grid),
            width=16 if narrow else width,
            num_heads=4,
            video_depth=1,
            image_depth=depth,
            head_depth=2,
            head_width=16 if narrow else width,
            flow_shift=1.5,
        )
        phi = _phi(16, 1, 2, 64, 16, 0.5)
        vae = _sd_vae((8,) * 4, 1, 4, px)
    return NovaPolicy(config, phi, vae, stand_in_tokenizer())


def build_harmon(size: str, narrow: bool):
    """Harmon at `size` (full: Harmon-1.5B = Qwen2.5-1.5B + MAR-H + KL-16; tiny: the tests'); `narrow` as for NOVA."""
    from margrpo.policy.harmon import HarmonConfig, HarmonPolicy

    if size == "full" and not narrow:
        return HarmonPolicy(HarmonConfig(), stand_in_tokenizer())
    full = size == "full"
    w = 32 if full else (16 if narrow else 32)
    llm = dict(
        HarmonConfig().llm, hidden_size=w, intermediate_size=2 * w, num_attention_heads=4, num_key_value_heads=2
    )
    if not full:
        llm.update(vocab_size=64, num_hidden_layers=2, max_position_embeddings=256)
    mar = dict(
        encoder_width=w,
        encoder_heads=4,
        decoder_width=w,
        decoder_heads=4,
        head_width=w,
        vae_channels=(8, 8, 16, 16, 32) if full else (8, 8, 16),
        vae_norm_groups=4,
    )
    if not full:
        mar.update(
            encoder_depth=1,
            decoder_depth=1,
            buffer_size=4,
            num_classes=10,
            pos_embed_size=16,
            image_size=32,
            head_depth=2,
            vae_layers_per_block=1,
            vae_latent_channels=4,
        )
    return HarmonPolicy(HarmonConfig(llm=llm, **mar), stand_in_tokenizer())


BUILD = {"nova": build_nova, "harmon": build_harmon}
