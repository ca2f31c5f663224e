"""The toy world's prompt suites: balanced over categories, train / val / eval disjoint, eval with unseen combinations.

Built from ShapesWorld's captioned scenes (`margrpo.world.captions.sample_captioned`) as
`PromptRecord`s, written with `margrpo.prompts.suites.write_suite`. Train and val never bind a held-out
(colour, shape) pair (`WorldConfig.heldout_pairs`); about half of each eval category that can name
colours does, like T2I-CompBench's val_unseen. The three splits are disjoint in prompt text and in
`canonical_key` (word order and mirrored relations).
"""

from __future__ import annotations

import numpy as np

from margrpo.prompts.suites import SPLITS, PromptRecord
from margrpo.world.captions import MAX_TRIES, canonical_key, caption_scene, heldout_in_spec, sample_captioned
from margrpo.world.config import CATEGORIES, WorldConfig
from margrpo.world.scene import ObjectSpec, Scene


def _with_heldout_pair(scene: Scene, rng, cfg: WorldConfig) -> Scene:
    """The scene with one random object given a random held-out (colour, shape) pair."""
    pairs = sorted(cfg.heldout_pairs())
    color, shape = pairs[int(rng.integers(len(pairs)))]
    objs = list(scene.objects)
    k = int(rng.integers(len(objs)))
    o = objs[k]
    objs[k] = ObjectSpec(color, shape, o.texture, o.size, o.cx, o.cy)
    return Scene(tuple(objs), scene.backdrop)


def _quota(n: int) -> dict[str, int]:
    base, rest = divmod(n, len(CATEGORIES))
    return {c: base + (i < rest) for i, c in enumerate(CATEGORIES)}


def build_suites(cfg: WorldConfig, seed: int, n_train: int, n_val: int, n_eval: int) -> dict[str, list[PromptRecord]]:
    """{"train", "val", "eval"} -> records, balanced over CATEGORIES (eval first, so it gets the
    held-out combinations; then val, then train, each avoiding every earlier prompt)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5017E5]))
    heldout = cfg.heldout_pairs()
    seen: set[str] = set()
    suites: dict[str, list[PromptRecord]] = {}
    for split, n in (("eval", n_eval), ("val", n_val), ("train", n_train)):
        records = []
        for category, quota in _quota(n).items():
            made, misses = 0, 0
            while made < quota:
                want_unseen = split == "eval" and heldout and made % 2 == 0 and misses < 50
                scene, prompt, _, spec = sample_captioned(rng, cfg, category, allow_heldout=False)
                if want_unseen:  # recaption a scene with a held-out pair; keep it only if the caption binds it
                    scene = _with_heldout_pair(scene, rng, cfg)
                    try:
                        prompt, _, spec = caption_scene(scene, rng, category)
                    except ValueError:
                        spec = None
                    if spec is None or not heldout_in_spec(spec, heldout):
                        misses += 1
                        continue
                key = canonical_key(spec)
                if key in seen:
                    misses += 1
                    if misses > MAX_TRIES:
                        raise ValueError(
                            f"could draw only {made} distinct {category} prompts for {split} (after earlier splits); "
                            f"lower --n-{split} or enlarge the world (palette, max_objects)"
                        )
                    continue
                seen.add(key)
                records.append(PromptRecord(prompt, category, spec))
                made, misses = made + 1, 0
        suites[split] = records
    return {s: suites[s] for s in SPLITS}
