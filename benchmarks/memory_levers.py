"""Peak memory of one GRPO step of a small random NOVA with each memory lever off / on (issue #17).

Each setting runs in a fresh child process (max RSS only grows within a process), which reports its
RSS after building the trainer and its max RSS after one `train_step`; the step's peak is the
difference. One script run measures every setting:

    PYTHONPATH=src python benchmarks/memory_levers.py [--width 128] [--depth 4] [--size 128]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource

SETTINGS = {
    "off": {},
    "gradient_checkpointing": {"gradient_checkpointing": True},
    "lora(rank 8)": {"lora": {"rank": 8}},
    "both": {"gradient_checkpointing": True, "lora": {"rank": 8}},
    "replay_chunk 1 (of |M| 4)": {"replay_chunk": 1},
    "checkpointing + chunk 1": {"gradient_checkpointing": True, "replay_chunk": 1},
}


def small_nova(width: int, depth: int, size: int):
    import torch
    from diffusers import AutoencoderKL
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PhiConfig, PhiModel, PreTrainedTokenizerFast

    from margrpo.policy.nova import NovaConfig, NovaPolicy

    torch.manual_seed(0)
    words = ["[PAD]", "[UNK]", "a", "red", "blue", "circle", "square"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    grid = size // 16  # stride-8 VAE, 2 x 2 latent patches per token
    config = NovaConfig(
        image_size=(size, size),
        text_token_dim=16,
        text_token_len=8,
        video_base_size=(1, grid // 2, grid // 2),
        image_base_size=(grid, grid),
        width=width,
        num_heads=4,
        video_depth=1,
        image_depth=depth,
        head_depth=2,
        head_width=width,
        flow_shift=1.5,
    )
    phi = PhiModel(
        PhiConfig(
            vocab_size=len(words),
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
        sample_size=size,
    )
    return NovaPolicy(config, phi, vae, tokenizer)


def one_step(args, levers: dict, queue) -> None:
    import tempfile

    import torch

    from margrpo.grpo.rollout import SamplingConfig
    from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
    from margrpo.policy.settings import PolicySettings
    from margrpo.prompts.suites import PromptSet

    torch.set_num_threads(1)
    prompts = PromptSet(["a red circle", "a blue square"], [{}, {}])

    def reward(images, p, m):
        return (images[:, 0].mean((1, 2)), {})

    cfg = GRPOConfig(
        steps=1,
        batch_prompts=2,
        group_size=4,
        mask_steps=4,
        diffusion_steps=4,
        micro_batches=1,
        precision="no",
        **{k: v for k, v in levers.items() if k not in PolicySettings.__dataclass_fields__},
    )
    settings = PolicySettings(**{k: v for k, v in levers.items() if k in PolicySettings.__dataclass_fields__})
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            small_nova(args.width, args.depth, args.size),
            reward,
            prompts,
            prompts,
            SamplingConfig(ar_steps=8, diffusion_steps=6),
            cfg,
            out,
            policy_settings=settings,
        )
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        trainer.train_step()
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    trained = sum(p.numel() for p in trainer.params)
    queue.put((before / 1024, after / 1024, trained))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--size", type=int, default=128)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    print(
        f"small NOVA: width {args.width}, image-encoder depth {args.depth}, {args.size} px; one GRPO step (8 images)"
    )
    print(f"{'setting':<24} {'trained params':>14} {'RSS before MB':>14} {'max RSS MB':>11} {'step peak MB':>13}")
    for name, levers in SETTINGS.items():
        queue = ctx.Queue()
        child = ctx.Process(target=one_step, args=(args, levers, queue))
        child.start()
        child.join()
        if child.exitcode:
            raise SystemExit(f"{name}: the child process failed (exit code {child.exitcode})")
        before, after, trained = queue.get()
        print(f"{name:<24} {trained:>14,} {before:>14.1f} {after:>11.1f} {after - before:>13.1f}")


if __name__ == "__main__":
    main()
