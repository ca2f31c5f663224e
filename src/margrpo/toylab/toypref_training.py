"""Training and held-out evaluation of toypref, the toy preference reward (`margrpo train-toypref`).

Pairs are drawn the way HPS's are collected, two images of one prompt and a choice, with the choice made by the
world's rules instead of people:

- *alignment* pairs: the prompt's scene against a scene of one of its hard negatives (`margrpo.world.negatives`: one
  attribute, relation, number or binding swapped), each on a backdrop of its own; the faithful image wins whatever
  its backdrop, so alignment outranks the aesthetic;
- *aesthetic* pairs: one scene of the prompt on two backdrops at least `min_gap` apart; the brighter one wins.

HPS's pairs are *generated* images, so each image here is degraded the way a toy policy's samples are (`degrade`:
blur, per-token gain errors, pixel noise, at random strengths; half the images clean): the scorer learns to read the
backdrop through generator-like artifacts instead of rewarding the artifacts themselves (trained on clean renders
alone, a policy's update noise raised its score as much as GRPO's signal did: docs/findings.md).
Loss: Bradley-Terry, -log sigmoid(score(winner) - score(loser)), from toyclip's weights (HPS from CLIP's) with a
fresh aesthetic tower. `evaluate_pairs` reports held-out accuracy for the two kinds apart, and for the alignment pairs
whose loser has the brighter backdrop (where a scorer that only saw the aesthetic would be wrong).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from margrpo.infra.runtime import warmup_cosine
from margrpo.rewards.toyclip import ToyClip
from margrpo.rewards.toypref import ToyPref
from margrpo.world import render, scene_for_spec
from margrpo.world.captions import sample_captioned
from margrpo.world.negatives import hard_negatives
from margrpo.world.scene import sample_backdrop

__all__ = ["PAIR_KINDS", "degrade", "sample_pairs", "train_toypref", "evaluate_pairs"]

PAIR_KINDS = ("alignment", "aesthetic")


def _pixels(images: list[np.ndarray]) -> Tensor:
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255  # [B, 3, s, s]


def degrade(images: Tensor, rng: np.random.Generator, token: int = 16, p_clean: float = 0.5) -> Tensor:
    """Generator-like artifacts on [B, 3, s, s] images in [0, 1], each image its own strengths (a fraction p_clean
    left clean): Gaussian blur of sigma U(0, 1) px, a gain of N(1, 0.1^2) per token x token patch and channel (a
    MAR's per-token errors), pixel noise of sigma U(0, 0.04); clamped to [0, 1]."""
    b, _, s, _ = images.shape
    out = images.clone()
    for i in np.nonzero(rng.random(b) >= p_clean)[0].tolist():
        x = out[i : i + 1]
        sigma = float(rng.uniform(0.0, 1.0))
        if sigma > 0.05:
            r = np.arange(-2, 3)
            k = torch.tensor(np.exp(-(r**2) / (2 * sigma**2)), dtype=x.dtype)
            k = k / k.sum()
            x = F.conv2d(F.pad(x, (2, 2, 0, 0), mode="replicate"), k.view(1, 1, 1, 5).expand(3, 1, 1, 5), groups=3)
            x = F.conv2d(F.pad(x, (0, 0, 2, 2), mode="replicate"), k.view(1, 1, 5, 1).expand(3, 1, 5, 1), groups=3)
        n = s // token
        gain = torch.from_numpy(rng.normal(1.0, 0.1, size=(1, 3, n, n))).to(x.dtype)
        x = x * gain.repeat_interleave(token, 2).repeat_interleave(token, 3)
        x = x + float(rng.uniform(0.0, 0.04)) * torch.from_numpy(rng.standard_normal(x.shape)).to(x.dtype)
        out[i : i + 1] = x.clamp(0, 1)
    return out


def sample_pairs(rng: np.random.Generator, world_cfg, n: int, min_gap: float = 0.02) -> dict:
    """`n` preference pairs, alternating alignment and aesthetic ones (held-out colour-shape pairs allowed, as
    toyclip's training): {"winners", "losers": [n, 3, s, s], "prompts": n, "kinds": n, "backdrops": [(w, l)]}."""
    lo, hi = world_cfg.backdrop_range
    if hi - lo < 2 * min_gap:
        raise ValueError(
            f"backdrop_range={world_cfg.backdrop_range} leaves no aesthetic to prefer: it needs a width of "
            f">= {2 * min_gap} (the world's backdrop_max); toypref needs a world whose scenes vary in it"
        )
    winners, losers, prompts, kinds, backdrops = [], [], [], [], []
    while len(prompts) < n:
        kind = PAIR_KINDS[len(prompts) % 2]
        scene, prompt, _, spec = sample_captioned(rng, world_cfg, allow_heldout=True)
        if kind == "alignment":
            negatives = hard_negatives(scene, spec, rng, world_cfg, 1)
            if not negatives:
                continue
            try:
                loser = scene_for_spec(negatives[0][1], rng, world_cfg)
            except ValueError:  # not drawable, e.g. a relation between two identical phrases
                continue
        else:
            a, b = sample_backdrop(rng, world_cfg), sample_backdrop(rng, world_cfg)
            if abs(a - b) < min_gap:
                continue
            scene, loser = (
                dataclasses.replace(scene, backdrop=max(a, b)),
                dataclasses.replace(scene, backdrop=min(a, b)),
            )
        winners.append(render(scene, world_cfg))
        losers.append(render(loser, world_cfg))
        prompts.append(prompt)
        kinds.append(kind)
        backdrops.append((scene.backdrop, loser.backdrop))
    return {
        "winners": degrade(_pixels(winners), rng),
        "losers": degrade(_pixels(losers), rng),
        "prompts": prompts,
        "kinds": kinds,
        "backdrops": backdrops,
    }


def preference_loss(model: ToyPref, pairs: dict) -> tuple[Tensor, dict[str, float]]:
    """Bradley-Terry loss over the pairs, and the batch's accuracy per kind."""
    n = len(pairs["prompts"])
    scores = model(torch.cat([pairs["winners"], pairs["losers"]]).to(model.device), pairs["prompts"] * 2)  # [2n]
    margin = scores[:n] - scores[n:]
    loss = F.softplus(-margin).mean()
    right = (margin > 0).float().cpu()
    stats = {"loss": loss.item(), "scale": model.alignment_scale.item()}
    for kind in PAIR_KINDS:
        mask = torch.tensor([k == kind for k in pairs["kinds"]])
        stats[f"acc_{kind}"] = right[mask].mean().item() if mask.any() else float("nan")
    return loss, stats


def train_toypref(
    clip: ToyClip,
    world_cfg,
    steps: int = 400,
    batch_size: int = 64,
    lr: float = 3e-4,
    aesthetic_width: int = 32,
    seed: int = 0,
    log: Callable[[str], None] = print,
    progress: bool = True,
) -> tuple[ToyPref, dict]:
    """Fine-tune `clip` into a ToyPref on freshly drawn pairs (numpy SeedSequence([seed, 2]); evaluation uses
    [seed, 3]). AdamW, warm-up over 5% of the steps then cosine decay; the new aesthetic tower and the alignment scale
    at 10x `lr`. Returns (model in eval mode, {"losses", "train_seconds", "train_cpu_seconds"})."""
    if steps < 1 or batch_size < 2:
        raise ValueError(f"steps={steps} must be >= 1 and batch_size={batch_size} >= 2")
    torch.manual_seed(seed)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 2]))
    model = ToyPref.from_toyclip(clip, aesthetic_width).train()
    fresh = [*model.aesthetic.parameters(), model.alignment_scale]
    base = list(model.clip.parameters())
    opt = torch.optim.AdamW(
        [{"params": base, "lr_scale": 1.0}, {"params": fresh, "lr_scale": 10.0, "weight_decay": 0.0}], lr=lr
    )
    warmup = max(1, steps // 20)
    losses = []
    start, start_cpu = time.perf_counter(), time.process_time()
    bar = tqdm(range(steps), desc="toypref", disable=not progress, mininterval=5.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr * group["lr_scale"] * warmup_cosine(step, steps, warmup)
        loss, stats = preference_loss(model, sample_pairs(rng, world_cfg, batch_size))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append({"step": step, **stats})
        if step % 50 == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{stats['loss']:.3f}", refresh=False)
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(
                f"toypref step {step}/{steps}: loss {stats['loss']:.4f}, "
                f"accuracy alignment {stats['acc_alignment']:.3f} "
                f"aesthetic {stats['acc_aesthetic']:.3f}, alignment scale {stats['scale']:.2f}"
            )
    model.eval()
    return model, {
        "losses": losses,
        "train_seconds": time.perf_counter() - start,
        "train_cpu_seconds": time.process_time() - start_cpu,
    }


@torch.no_grad()
def evaluate_pairs(model: ToyPref, world_cfg, n: int = 1000, seed: int = 0, batch_size: int = 200) -> dict:
    """Held-out pair accuracy (fresh pairs from SeedSequence([seed, 3])): overall, per kind, and for the alignment
    pairs whose loser sits on the brighter backdrop; plus how far each term separates the two images."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 3]))
    model.eval()
    rows = []
    for start in range(0, n, batch_size):
        pairs = sample_pairs(rng, world_cfg, min(batch_size, n - start))
        k = len(pairs["prompts"])
        align, aes = model.components(
            torch.cat([pairs["winners"], pairs["losers"]]).to(model.device), pairs["prompts"] * 2
        )
        for i in range(k):
            rows.append(
                (
                    pairs["kinds"][i],
                    pairs["backdrops"][i][1] > pairs["backdrops"][i][0],
                    (align[i] - align[k + i]).item(),
                    (aes[i] - aes[k + i]).item(),
                )
            )

    def accuracy(select) -> dict:
        picked = [r for r in rows if select(r)]
        return {
            "accuracy": float(np.mean([(r[2] + r[3]) > 0 for r in picked])) if picked else float("nan"),
            "n": len(picked),
            "alignment_margin": float(np.mean([r[2] for r in picked])) if picked else float("nan"),
            "aesthetic_margin": float(np.mean([r[3] for r in picked])) if picked else float("nan"),
        }

    return {
        "overall": accuracy(lambda r: True),
        **{kind: accuracy(lambda r, kind=kind: r[0] == kind) for kind in PAIR_KINDS},
        "alignment_loser_brighter": accuracy(lambda r: r[0] == "alignment" and r[1]),
    }
