"""How well a policy follows ShapesWorld prompts: the numbers that gate a toy base policy.

Per category strict / lenient scores, the same images scored against shuffled prompts (what a
policy that ignores the prompt would get), and single-object colour-AND-shape accuracy (the
"draws recognisable objects" bar), split into (colour, shape) pairs seen in training and the
held-out pairs of the evaluation split (compositional generalisation, a much harder question).
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from margrpo.grpo.rollout import SamplingConfig, generate
from margrpo.infra.runtime import autocast
from margrpo.policy.base import MARPolicy


@torch.no_grad()
def sample_images(
    policy: MARPolicy,
    prompts: list[str],
    sampling: SamplingConfig,
    images_per_prompt: int = 1,
    seed: int = 0,
    batch_size: int = 32,
    precision: str = "bf16",
    desc: str = "sample",
) -> np.ndarray:
    """uint8 images [len(prompts) * images_per_prompt, H, W, 3], prompt-major, deterministic per seed.
    A toy-mask policy (`ToyMaskPolicy`, with a `MaskSamplingConfig`) samples through
    `related.maskgrpo.rollout.generate`."""
    from margrpo.related.maskgrpo.policy import ToyMaskPolicy

    out = []
    per_batch = max(1, batch_size // images_per_prompt)
    for a in tqdm(range(0, len(prompts), per_batch), desc=desc, mininterval=5):
        g = torch.Generator().manual_seed(seed * 100_003 + a)
        if isinstance(policy, ToyMaskPolicy):  # discrete tokens: no autocast, MaskGIT's sampler
            from margrpo.related.maskgrpo.rollout import generate as mask_generate

            r = mask_generate(policy, prompts[a : a + per_batch], sampling, images_per_prompt, g)
        else:
            with autocast(policy.device, precision):
                r = generate(policy, prompts[a : a + per_batch], sampling, group_size=images_per_prompt, generator=g)
        out.append((r.images.float().clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).cpu().numpy())
    return np.concatenate(out)


def _single_object(spec: dict) -> bool:
    objs = spec["objects"]
    return (
        len(objs) == 1
        and objs[0].get("color")
        and objs[0].get("shape")
        and objs[0].get("count", 1) == 1
        and not spec.get("relation")
    )


def quality_report(
    policy: MARPolicy,
    records,
    sampling: SamplingConfig,
    images_per_prompt: int = 2,
    seed: int = 0,
    world_cfg=None,
    precision: str = "bf16",
) -> dict:
    from margrpo.world import parse, score

    images = sample_images(
        policy, [r.prompt for r in records], sampling, images_per_prompt, seed, precision=precision, desc="quality"
    )
    recs = [r for r in records for _ in range(images_per_prompt)]
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(records))
    while len(records) > 1 and np.any(perm == np.arange(len(records))):  # a derangement: every prompt mismatched
        perm = rng.permutation(len(records))
    shuffled = [records[j] for j in perm for _ in range(images_per_prompt)]
    heldout = world_cfg.heldout_pairs() if world_cfg is not None else frozenset()
    rows = []
    for img, rec, other in zip(images, recs, shuffled):
        s = score(rec.spec, img, rec.category, world_cfg)
        b = score(other.spec, img, other.category, world_cfg)
        row = {
            "category": rec.category,
            "strict": s["strict"],
            "lenient": s["lenient"],
            "shuffled_strict": b["strict"],
            "shuffled_lenient": b["lenient"],
        }
        if _single_object(rec.spec):
            want = rec.spec["objects"][0]
            row["single_color_shape"] = float(
                any(o["color"] == want["color"] and o["shape"] == want["shape"] for o in parse(img, world_cfg))
            )
            row["single_heldout"] = (want["color"], want["shape"]) in heldout
        rows.append(row)
    import pandas as pd

    df = pd.DataFrame(rows)
    per_cat = df.groupby("category")[["strict", "lenient", "shuffled_strict", "shuffled_lenient"]].mean()
    report = {
        "n_images": len(df),
        "overall": df[["strict", "lenient", "shuffled_strict", "shuffled_lenient"]].mean().to_dict(),
        "per_category": per_cat.to_dict(orient="index"),
    }
    if "single_color_shape" in df:
        report["single_object_color_and_shape"] = _single_object_accuracy(df)
    return report, images


def _single_object_accuracy(df) -> dict:
    """How often a single-object prompt's image holds an object of its colour and shape: over all such
    images, and apart for the colour-shape pairs seen in training and those held out of it."""
    single = df.dropna(subset=["single_color_shape"])
    entry = {"accuracy": float(single["single_color_shape"].mean()), "n_images": int(len(single))}
    for name, part in (
        ("seen_pairs", single[~single["single_heldout"].astype(bool)]),
        ("heldout_pairs", single[single["single_heldout"].astype(bool)]),
    ):
        entry[name] = {
            "accuracy": float(part["single_color_shape"].mean()) if len(part) else float("nan"),
            "n_images": int(len(part)),
        }
    return entry


def format_report(report: dict) -> str:
    lines = [f"{'category':<10} {'strict':>7} {'lenient':>8} {'shuffled':>9}"]
    for cat, v in report["per_category"].items():
        lines.append(f"{cat:<10} {v['strict']:7.3f} {v['lenient']:8.3f} {v['shuffled_strict']:9.3f}")
    o = report["overall"]
    lines.append(f"{'overall':<10} {o['strict']:7.3f} {o['lenient']:8.3f} {o['shuffled_strict']:9.3f}")
    if "single_object_color_and_shape" in report:
        s = report["single_object_color_and_shape"]
        lines.append(f"single-object colour AND shape: {s['accuracy']:.3f} over {s['n_images']} images")
        for name in ("seen_pairs", "heldout_pairs"):
            if name in s:
                lines.append(
                    f"  {name.replace('_', ' '):<14} {s[name]['accuracy']:.3f} over {s[name]['n_images']} images"
                )
    return "\n".join(lines)
