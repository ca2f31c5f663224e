"""Do the learned rewards still read a base's own samples? Issue 58 item 5: toyclip and toypref were trained on
renders degraded "as a toy policy's samples are"; a new base draws differently.

    python benchmarks/rewards_on_samples.py --data results/data/shapesworld-<hash8> \
        --policy results/pretrain/toy-nova-<hash8>/policy \
        --toyclip results/toyclip/toyclip-<hash8>/model --toypref results/toypref/toypref-<hash8>/model

Samples `--images` per evaluation prompt (the quality report's sampler and settings), reads each with the exact
parser, and measures on them what the rewards' own held-out metrics measure on renders:
- toyclip ranking: for every sample the parser reads as its prompt (lenient 1), P(score(image, prompt) >
  score(image, swap)) over each swap type's false captions of what the parser found (`world.negatives`);
- toypref, alignment term: over prompts with a faithful (strict 1) and an unfaithful sample, P(align(faithful) >
  align(unfaithful)); aesthetic term: its Pearson r with the backdrop level read from the pixels.
Prints the numbers beside the rewards' metrics.json (renders). No timing.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import torch

from margrpo.evaluation.quality import sample_images
from margrpo.grpo.rollout import SamplingConfig
from margrpo.policy import load_policy
from margrpo.prompts.suites import load_suite
from margrpo.rewards.toyclip import ToyClip
from margrpo.rewards.toypref import ToyPref
from margrpo.stages.pretrain import load_world
from margrpo.world import parse, score
from margrpo.world.captions import prompt_for_spec
from margrpo.world.negatives import SWAP_TYPES, spec_is_true, swap_candidates
from margrpo.world.scene import backdrop_level


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--toyclip", required=True)
    ap.add_argument("--toypref", required=True)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--sampling", default='{"ar_steps": 8, "final_step_noise": true}')
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    world = load_world(Path(args.data) / "world.json")
    records = load_suite(Path(args.data) / "eval.jsonl")
    policy = load_policy(args.policy)
    images = sample_images(
        policy,
        [r.prompt for r in records],
        SamplingConfig(**json.loads(args.sampling)),
        args.images,
        args.seed,
        precision="no",
        desc="samples",
    )
    recs = [r for r in records for _ in range(args.images)]
    objects = [parse(im, world) for im in images]
    strict = [score(r.spec, im, r.category, world)["strict"] == 1 for r, im in zip(recs, images)]
    pixels = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255

    clip = ToyClip.from_pretrained(args.toyclip).eval()
    rng = np.random.default_rng(args.seed)
    per_type: dict[str, list[bool]] = {t: [] for t in SWAP_TYPES}
    with torch.no_grad():
        for i, (r, objs) in enumerate(zip(recs, objects)):
            if not spec_is_true(r.spec, objs, world.image_size):
                continue
            img = clip.encode_images(pixels[i : i + 1])
            true = (img * clip.encode_text([r.prompt])).sum(-1)
            for kind in SWAP_TYPES:
                pool = [c for c in swap_candidates(r.spec, kind, world) if not spec_is_true(c, objs, world.image_size)]
                if pool:
                    neg = prompt_for_spec(pool[int(rng.integers(len(pool)))])
                    per_type[kind].append(bool(true > (img * clip.encode_text([neg])).sum(-1)))
    flat = [g for v in per_type.values() for g in v]
    ranking = {t: (float(np.mean(v)), len(v)) for t, v in per_type.items() if v}

    pref = ToyPref.from_pretrained(args.toypref).eval()
    with torch.no_grad():
        align, aes = pref.components(pixels, [r.prompt for r in recs])
    wins = []
    for p in range(len(records)):
        idx = range(p * args.images, (p + 1) * args.images)
        good, bad = [i for i in idx if strict[i]], [i for i in idx if not strict[i]]
        wins += [bool(align[g] > align[b]) for g, b in itertools.product(good, bad)]
    level = backdrop_level(np.stack(images))
    aes_r = float(np.corrcoef(aes.numpy(), level)[0, 1])

    out = {
        "samples": len(images),
        "faithful_lenient": int(sum(spec_is_true(r.spec, o, world.image_size) for r, o in zip(recs, objects))),
        "faithful_strict": int(sum(strict)),
        "toyclip_ranking_on_samples": float(np.mean(flat)) if flat else float("nan"),
        "toyclip_ranking_n": len(flat),
        "toyclip_per_type": ranking,
        "toypref_alignment_pairs": float(np.mean(wins)) if wins else float("nan"),
        "toypref_alignment_pairs_n": len(wins),
        "toypref_aesthetic_r_backdrop": aes_r,
    }
    for name, folder in (("toyclip", args.toyclip), ("toypref", args.toypref)):
        metrics = Path(folder).parent / "metrics.json"
        if metrics.is_file():
            out[f"{name}_metrics_on_renders"] = json.loads(metrics.read_text())
    print(json.dumps({k: v for k, v in out.items() if not k.endswith("on_renders")}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
