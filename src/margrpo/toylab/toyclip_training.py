"""Training and held-out evaluation of toyclip, the learned toy reward (`margrpo train-toyclip`).

Training renders random scenes on the fly, captions them with the world's captioner and adds
*hard negatives* per image (`margrpo.world.negatives`): the caption with one attribute swapped
(colour, shape, texture, relation, number, or the attributes of two objects exchanged), dropped
if still true of the scene. Each scene is paired in the batch with a scene drawn for one of its
compositional swaps, so that binding ("a red circle and a blue square" vs "a blue circle and a
red square") has hard negative images as well as texts. Loss: symmetric InfoNCE + hard-negative
cross-entropy. `evaluate_ranking` measures how often the true caption outscores a swapped one on
held-out scenes, per swap type. The model and the reward live in `margrpo.rewards.toyclip`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from margrpo.infra.files import atomic_dir
from margrpo.infra.runtime import warmup_cosine
from margrpo.rewards.toyclip import ToyClip, ToyClipConfig
from margrpo.world import prompt_for_spec, prompt_vocabulary, render, scene_for_spec
from margrpo.world.captions import sample_captioned
from margrpo.world.negatives import (
    COMPOSITIONAL_SWAPS,
    SWAP_TYPES,
    hard_negatives,
    one_negative,
    scene_objects,
    spec_is_true,
)

__all__ = [
    "Batch",
    "sample_batch",
    "contrastive_loss",
    "default_vocabulary",
    "train_toyclip",
    "save_atomic",
    "evaluate_ranking",
]


@dataclass
class Batch:
    images: Tensor  # [B, 3, s, s] in [0, 1]
    prompts: list[str]  # B true captions
    negatives: list[list[str]]  # per image up to K false captions
    negative_types: list[list[str]]  # their swap types


def sample_batch(rng: np.random.Generator, world_cfg, batch_size: int, k: int, paired: bool = True) -> Batch:
    """Random captioned scenes (uniform category, held-out pairs allowed), rendered, k hard negatives each.

    With `paired`, every scene is followed by a *partner*: a fresh scene drawn for the scene's first
    compositional hard negative (e.g. "a blue circle and a red square" after "a red circle and a blue
    square"), on which the first caption is false. The in-batch contrast then also has hard
    negative *images*: the same words, bound differently, so the image tower gets a direct signal
    for binding, not only one mediated by the text tower's. Measured at the default settings on
    the 32-px world (held-out binding swaps, 420 triples): 0.57 without partners, 0.84 with.
    """
    rows: list[tuple] = []  # (scene, spec, negatives)
    while len(rows) < batch_size:
        scene, _, _, spec = sample_captioned(rng, world_cfg, allow_heldout=True)
        rows.append((scene, spec, hard_negatives(scene, spec, rng, world_cfg, k)))
        if paired and len(rows) < batch_size:
            partner = _partner(spec, rows[-1][2], rng, world_cfg)
            if partner is not None:
                rows.append((*partner, hard_negatives(*partner, rng, world_cfg, k)))
    images = np.stack([render(scene, world_cfg) for scene, _, _ in rows])  # [B, s, s, 3] uint8
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255  # [B, 3, s, s]
    return Batch(
        pixels,
        prompts=[prompt_for_spec(spec) for _, spec, _ in rows],
        negatives=[[prompt_for_spec(neg) for _, neg in negs] for _, _, negs in rows],
        negative_types=[[kind for kind, _ in negs] for _, _, negs in rows],
    )


def _partner(spec: dict, negatives: list[tuple[str, dict]], rng: np.random.Generator, world_cfg):
    """(scene, spec) drawn for the first compositional negative on which `spec` is false; or None."""
    for kind, neg in negatives:
        if kind not in COMPOSITIONAL_SWAPS:
            continue
        try:
            other = scene_for_spec(neg, rng, world_cfg)
        except ValueError:  # not drawable, e.g. a relation between two identical phrases
            continue
        if not spec_is_true(spec, scene_objects(other), world_cfg.image_size):
            return other, neg
    return None


def contrastive_loss(model: ToyClip, batch: Batch, hard_weight: float = 1.0) -> tuple[Tensor, dict[str, float]]:
    """Symmetric InfoNCE over the batch + hard-negative cross-entropy (true caption vs its swaps).

    InfoNCE ignores other images' captions that are word-for-word the image's own (e.g. two scenes
    both captioned "a red circle"), which would otherwise be false negatives.
    """
    B = len(batch.prompts)
    k = max((len(n) for n in batch.negatives), default=0)
    img = model.encode_images(batch.images)  # [B, E]
    flat_negs = [t for negs in batch.negatives for t in negs]
    txt = model.encode_text(batch.prompts + flat_negs)  # [B + N, E]
    pos, neg = txt[:B], txt[B:]  # [B, E], [N, E]
    scale = model.scale()

    # 1. InfoNCE (CLIP eq. in both directions), duplicates of the own caption masked out
    logits = scale * img @ pos.T  # [B, B]
    dup = torch.tensor([[p == q for q in batch.prompts] for p in batch.prompts], device=logits.device)
    dup.fill_diagonal_(False)
    logits = logits.masked_fill(dup, float("-inf"))
    target = torch.arange(B, device=logits.device)
    nce = 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))

    # 2. hard negatives: per image, [true, swap_1..swap_K] with missing swaps masked; target 0
    hard = torch.zeros((), device=logits.device)
    if k:
        neg_pad = torch.zeros(B, k, neg.shape[-1], device=neg.device)  # [B, K, E]
        valid = torch.zeros(B, k, dtype=torch.bool, device=neg.device)
        start = 0
        for i, negs in enumerate(batch.negatives):
            neg_pad[i, : len(negs)] = neg[start : start + len(negs)]
            valid[i, : len(negs)] = True
            start += len(negs)
        sims = torch.cat(
            [(img * pos).sum(-1, keepdim=True), torch.einsum("be,bke->bk", img, neg_pad)], dim=1
        )  # [B, 1 + K]
        sims = (scale * sims).masked_fill(
            ~torch.cat([torch.ones(B, 1, dtype=torch.bool, device=neg.device), valid], 1), float("-inf")
        )
        hard = F.cross_entropy(sims, torch.zeros(B, dtype=torch.long, device=neg.device))
    loss = nce + hard_weight * hard
    return loss, {"loss": loss.item(), "nce": nce.item(), "hard": hard.item(), "scale": scale.item()}


def default_vocabulary(world_cfg) -> list[str]:
    """Every word a prompt of this world can contain (the world's list), so no caption meets [UNK]."""
    return prompt_vocabulary(world_cfg)


def train_toyclip(
    world_cfg,
    steps: int = 1500,
    batch_size: int = 64,
    lr: float = 1e-3,
    width: int = 64,
    seed: int = 0,
    out_dir: str | Path | None = None,
    log: Callable[[str], None] = print,
    n_negatives: int = 2,
    hard_weight: float = 1.0,
    weight_decay: float = 0.01,
    precision: str = "fp32",
    device: str | torch.device = "cpu",
    paired: bool = True,
    progress: bool = True,
    callback: Callable[[int, ToyClip], None] | None = None,
    model_config: dict | None = None,
) -> tuple[ToyClip, dict]:
    """Train a ToyClip from scratch on freshly rendered ShapesWorld scenes; save to `out_dir` if given.

    Each step draws `batch_size` captioned scenes (half of them partners, see `sample_batch`) with
    `n_negatives` hard negatives each, from numpy rng SeedSequence([seed, 0]) (evaluation draws from
    another stream). AdamW, linear warm-up over 5% of the steps then cosine decay, grad-norm clip 1.
    Defaults reach >= 90% held-out ranking accuracy in about 2.5 CPU-minutes on one thread
    (measured: 0.927 on the 64-px / 4x4-grid world, 0.92 on the 32-px one).
    `model_config` sets further ToyClipConfig fields; `callback(step, model)` runs after every step
    (e.g. a periodic evaluation, which must restore train mode).

    Returns (model in eval mode, {"losses": per-step dicts, "train_seconds": wall time,
    "train_cpu_seconds": this process's CPU time, the fair measure on a shared machine}).
    """
    _check_settings(steps, batch_size, precision)
    torch.manual_seed(seed)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0]))
    cfg = ToyClipConfig(
        image_size=world_cfg.image_size, width=width, vocab=default_vocabulary(world_cfg), **(model_config or {})
    )
    model = ToyClip(cfg).to(device).train()
    opt = _optimizer(model, lr, weight_decay)
    warmup = max(1, steps // 20)
    losses = []
    start, start_cpu = time.perf_counter(), time.process_time()
    bar = tqdm(range(steps), desc="toyclip", disable=not progress, mininterval=5.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr * warmup_cosine(step, steps, warmup)
        batch = sample_batch(rng, world_cfg, batch_size, n_negatives, paired)
        stats = _update(model, opt, batch, hard_weight, precision, device)
        losses.append({"step": step, **stats})
        _report(bar, log, step, steps, stats)
        if callback is not None:
            callback(step, model)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
    model.eval()
    if out_dir is not None:
        save_atomic(model, out_dir)
    return model, {"losses": losses, "train_seconds": seconds, "train_cpu_seconds": cpu_seconds}


def _check_settings(steps: int, batch_size: int, precision: str) -> None:
    if steps < 1 or batch_size < 2:
        raise ValueError(f"steps={steps} must be >= 1 and batch_size={batch_size} >= 2 (InfoNCE needs other images)")
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"Unknown precision: {precision!r}; expected one of ('fp32', 'bf16')")


def _optimizer(model: ToyClip, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW, weight decay on weight matrices and kernels only (not on biases, norms, the logit scale or
    embeddings)."""
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embeddings" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embeddings" not in n)]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )


def _update(
    model: ToyClip, opt: torch.optim.Optimizer, batch: Batch, hard_weight: float, precision: str, device
) -> dict[str, float]:
    """One optimiser step on `batch` (moved to `device`), grad-norm clipped to 1; returns the loss terms."""
    batch.images = batch.images.to(device)
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss, stats = contrastive_loss(model, batch, hard_weight)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return stats


def _report(bar, log: Callable[[str], None], step: int, steps: int, stats: dict[str, float]) -> None:
    """Progress-bar postfix every 50 steps, a log line every tenth of the run (and both at the end)."""
    if step % 50 == 0 or step == steps - 1:
        bar.set_postfix(loss=f"{stats['loss']:.3f}", hard=f"{stats['hard']:.3f}", refresh=False)
    if step % max(1, steps // 10) == 0 or step == steps - 1:
        log(
            f"toyclip step {step}/{steps}: loss {stats['loss']:.4f} (nce {stats['nce']:.4f}, "
            f"hard {stats['hard']:.4f}), scale {stats['scale']:.1f}"
        )


def save_atomic(model, out_dir: str | Path) -> Path:
    """`model.save_pretrained` into a sibling temp folder, then rename it onto `out_dir` (replacing an old one):
    toyclip's and toypref's stages both write their folder this way."""
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
    return Path(out_dir)


@torch.no_grad()
def evaluate_ranking(model: ToyClip, world_cfg, n: int = 2000, seed: int = 1, batch_size: int = 256) -> dict:
    """Held-out ranking accuracy: P(score(image, true caption) > score(image, swapped caption)).

    Fresh scenes from SeedSequence([seed, 1]) (training draws from [seed, 0]); each scene gives one
    triple per swap type that has a false swap for it, until `n` triples. Ties count as wrong.
    Returns {"overall": accuracy over all triples, "macro": mean of the per-type accuracies,
    "n": int, "per_type": {type: {"accuracy", "n"}}, "mean_margin": mean score(true) - score(swap)}.
    """
    rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    model.eval()
    correct: dict[str, list[bool]] = {t: [] for t in SWAP_TYPES}
    margins: list[float] = []
    total = 0
    while total < n:
        images, trues, negs, kinds = [], [], [], []
        while len(trues) < batch_size and total < n:
            scene, prompt, _, spec = sample_captioned(rng, world_cfg, allow_heldout=True)
            image = render(scene, world_cfg)
            for kind in SWAP_TYPES:
                found = one_negative(scene, spec, kind, rng, world_cfg)
                if found is None or total >= n:
                    continue
                images.append(image)
                trues.append(prompt)
                negs.append(found)
                kinds.append(kind)
                total += 1
        if not trues:
            continue
        pixels = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float().to(model.device) / 255
        img = model.encode_images(pixels)  # [b, E]
        s_true = (img * model.encode_text(trues)).sum(-1)  # [b]
        s_neg = (img * model.encode_text(negs)).sum(-1)  # [b]
        for kind, good, m in zip(kinds, (s_true > s_neg).tolist(), (s_true - s_neg).tolist()):
            correct[kind].append(good)
            margins.append(m)
    per_type = {t: {"accuracy": float(np.mean(v)), "n": len(v)} for t, v in correct.items() if v}
    flat = [g for v in correct.values() for g in v]
    return {
        "overall": float(np.mean(flat)),
        "macro": float(np.mean([v["accuracy"] for v in per_type.values()])),
        "n": len(flat),
        "per_type": per_type,
        "mean_margin": float(np.mean(margins)),
    }
