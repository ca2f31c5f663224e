"""Pre-training of the discrete toy-mask policy on ShapesWorld, and its CompBench-style accuracy.

The loss is MaskGIT's: mask a random fraction of an image's cell tokens (ratio cos(pi/2 u), u uniform,
so mostly high ratios, at least one token), and take the cross-entropy of the codebook categorical at
the masked positions. Scenes need no rendering: a captioned scene is encoded straight into tokens.
The prompt is dropped (replaced by the null prompt) 10% of the time, for classifier-free guidance.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from margrpo.infra.runtime import warmup_cosine
from margrpo.related.maskgrpo.policy import ToyMaskPolicy
from margrpo.related.maskgrpo.rollout import MaskSamplingConfig, generate

log = logging.getLogger(__name__)

TokenBatchFn = Callable[[int, torch.Generator], tuple[Tensor, list[str]]]  # -> tokens [B, L], prompts


@dataclass
class MaskPretrainConfig:
    steps: int = 600
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 50  # linear LR warm-up, then cosine decay to 10%
    weight_decay: float = 0.02
    text_dropout: float = 0.1  # replace the prompt by the null prompt, for classifier-free guidance
    grad_clip: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if min(self.steps, self.batch_size) < 1 or not self.lr > 0 or not 0 <= self.text_dropout < 1:
            raise ValueError("steps and batch_size must be >= 1, lr > 0 and text_dropout in [0, 1)")


def world_token_batches(policy: ToyMaskPolicy) -> TokenBatchFn:
    """(tokens [B, L], prompts) of random captioned scenes of the policy's world, drawn from the torch generator."""
    from margrpo.world.captions import sample_captioned

    def batch(n: int, generator: torch.Generator) -> tuple[Tensor, list[str]]:
        rng = np.random.default_rng(int(torch.randint(0, 2**62, (), generator=generator)))
        pairs = [sample_captioned(rng, policy.world) for _ in range(n)]
        return policy.encode_scenes([scene for scene, *_ in pairs]), [prompt for _, prompt, _, _ in pairs]

    return batch


def masked_token_loss(policy: ToyMaskPolicy, tokens: Tensor, prompts: list[str], generator: torch.Generator) -> Tensor:
    """Cross-entropy of the masked positions (mean over them), each image at its own cosine mask ratio."""
    B, L = tokens.shape
    ratio = torch.cos(math.pi / 2 * torch.rand(B, generator=generator))  # [B], MaskGIT's schedule
    n_masked = (ratio * L).ceil().clamp(1, L).to(tokens.device)
    rank = torch.rand(B, L, generator=generator).argsort(1).argsort(1).to(tokens.device)  # a random order per image
    masked = rank < n_masked[:, None]  # [B, L]
    logits = policy.logits(torch.where(masked, policy.mask_id, tokens), policy.encode_prompts(prompts))  # [B, L, V]
    return F.cross_entropy(logits[masked], tokens[masked])


def pretrain_mask_policy(
    policy: ToyMaskPolicy, cfg: MaskPretrainConfig, batch_fn: TokenBatchFn | None = None
) -> list[dict]:
    """Train in place; one row per step (step, loss, grad_norm, lr, wall_time_s). Leaves the policy in eval mode."""
    batch_fn = batch_fn or world_token_batches(policy)
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    rows, t0 = [], time.time()
    policy.train()
    bar = tqdm(range(cfg.steps), desc="pretrain toy-mask", mininterval=5)
    for step in bar:
        lr = cfg.lr * warmup_cosine(step, cfg.steps, cfg.warmup_steps, floor=0.1)
        for group in optimizer.param_groups:
            group["lr"] = lr
        tokens, prompts = batch_fn(cfg.batch_size, generator)
        prompts = [("" if torch.rand((), generator=generator).item() < cfg.text_dropout else p) for p in prompts]
        loss = masked_token_loss(policy, tokens.to(policy.device), prompts, generator)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite pre-training loss at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        rows.append(
            {
                "step": step + 1,
                "loss": loss.item(),
                "grad_norm": float(grad_norm),
                "lr": lr,
                "wall_time_s": time.time() - t0,
            }
        )
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
    policy.eval()
    return rows


@torch.no_grad()
def compbench_accuracy(
    policy: ToyMaskPolicy,
    records,
    sampling: MaskSamplingConfig,
    images_per_prompt: int = 1,
    seed: int = 0,
    batch_prompts: int = 32,
) -> dict:
    """The world's exact CompBench-style score of generated images against their suite records:
    {"overall": {strict, lenient, shuffled_strict}, "per_category": {cat: {...}}, "n_images"}. The
    shuffled baseline scores the same images against a derangement of the records (a policy that ignores
    the prompt)."""
    from margrpo.world import score
    from margrpo.world.reward import to_uint8_images

    images = []
    for a in range(0, len(records), batch_prompts):
        g = torch.Generator().manual_seed(seed * 100_003 + a)
        r = generate(policy, [rec.prompt for rec in records[a : a + batch_prompts]], sampling, images_per_prompt, g)
        images.append(to_uint8_images(r.images))
    images = np.concatenate(images)
    perm = np.roll(np.arange(len(records)), 1)  # every record paired with another one
    rows = []
    for i, img in enumerate(images):
        rec, other = records[i // images_per_prompt], records[perm[i // images_per_prompt]]
        s, b = score(rec.spec, img, rec.category, policy.world), score(other.spec, img, other.category, policy.world)
        rows.append(
            {"category": rec.category, "strict": s["strict"], "lenient": s["lenient"], "shuffled_strict": b["strict"]}
        )
    import pandas as pd

    df = pd.DataFrame(rows)
    keys = ["strict", "lenient", "shuffled_strict"]
    return {
        "n_images": len(df),
        "overall": df[keys].mean().to_dict(),
        "per_category": df.groupby("category")[keys].mean().to_dict(orient="index"),
    }
