"""Hard negatives of a caption and the truth of a spec on a scene (the toy reward's training data).

A negative is the caption's spec with one swap (`swap_candidates`), turned back into text by
`prompt_for_spec`, and kept only if it is *false* of the scene by the world scorer's rules
(`spec_is_true` on the scene's ground-truth objects). So "a red circle and a blue circle" with
its colours exchanged says the same thing and is never a negative. Used by
`margrpo.toylab.toyclip_training` to train and evaluate toyclip; plain numpy, no model.
"""

from __future__ import annotations

import numpy as np

from margrpo.world.captions import prompt_for_spec
from margrpo.world.config import WorldConfig
from margrpo.world.scene import Scene, relation_holds
from margrpo.world.scoring import RELATION_MARGIN

__all__ = [
    "SWAP_TYPES",
    "COMPOSITIONAL_SWAPS",
    "swap_candidates",
    "scene_objects",
    "spec_is_true",
    "hard_negatives",
    "one_negative",
]

SWAP_TYPES: tuple[str, ...] = ("color", "shape", "texture", "relation", "number", "binding")
COMPOSITIONAL_SWAPS = ("binding", "relation", "texture")  # the words stay in the scene, only who-has-what changes
_RELATION_SWAPS = {
    "left of": ("right of",),
    "right of": ("left of",),
    "above": ("below",),
    "below": ("above",),
    "next to": ("above", "below"),
}
_ATTR_VOCAB = {"color": "palette", "shape": "shapes", "texture": "textures"}  # spec attribute -> WorldConfig field
_MAX_COUNT = 9  # prompts spell counts one..nine


def _with_phrase(spec: dict, index: int, **changes) -> dict:
    objects = [dict(o) for o in spec["objects"]]
    objects[index].update(changes)
    return {**spec, "objects": objects}


def swap_candidates(spec: dict, kind: str, world_cfg: WorldConfig) -> list[dict]:
    """Every spec one `kind` swap away from `spec` (not yet checked against a scene).

    color / shape / texture: one phrase's attribute -> another value of the world's vocabulary;
    relation: left <-> right, above <-> below, next to -> above / below;
    number: a phrase's spelled count +-1 (only where the caption spells a number);
    binding: two phrases exchange an attribute both name with different values
    ("a red circle and a blue square" -> "a blue circle and a red square").
    """
    objects = spec["objects"]
    if kind in _ATTR_VOCAB:
        values = getattr(world_cfg, _ATTR_VOCAB[kind])
        return [
            _with_phrase(spec, i, **{kind: v})
            for i, o in enumerate(objects)
            if o[kind] is not None
            for v in values
            if v != o[kind]
        ]
    if kind == "relation":
        rel = spec["relation"]
        return [] if rel is None else [{**spec, "relation": {**rel, "type": t}} for t in _RELATION_SWAPS[rel["type"]]]
    if kind == "number":
        out = []
        for i, o in enumerate(objects):
            if spec["exact_count"] or o["count"] > 1:  # the caption spells this count
                out += [
                    _with_phrase(spec, i, count=n) for n in (o["count"] - 1, o["count"] + 1) if 1 <= n <= _MAX_COUNT
                ]
        return out
    if kind == "binding":
        out = []
        for i in range(len(objects)):
            for j in range(i + 1, len(objects)):
                for attr in _ATTR_VOCAB:
                    a, b = objects[i][attr], objects[j][attr]
                    if a is not None and b is not None and a != b:
                        out.append(_with_phrase(_with_phrase(spec, i, **{attr: b}), j, **{attr: a}))
        return out
    raise ValueError(f"Unknown swap type: {kind!r}; expected one of {SWAP_TYPES}")


def scene_objects(scene: Scene) -> list[dict]:
    """The scene's ground truth in the parser's object format (what the world's `score_objects` reads)."""
    return [{"color": o.color, "shape": o.shape, "texture": o.texture, "centroid": o.centroid} for o in scene.objects]


def spec_is_true(spec: dict, objects: list[dict], image_size: int) -> bool:
    """Does the scene satisfy everything `spec` asks, i.e. would the world's scorer give it a lenient
    score of 1? Same rules as `margrpo.world.scoring.score_objects` (tests check they agree), in
    plain Python: that scorer costs ~30 us a call, and training checks ~400 swaps a step.

    1. binding: every slot (a phrase of count n gives n) fully matched by a distinct object;
    2. relation: some pair of distinct objects, each fully matching its side, in the relation
       (centroids, dominant axis, the scorer's margin);
    3. exact counts: exactly `count` objects fully match each phrase.
    """
    phrases = spec["objects"]
    fits = [
        [all(p[a] is None or o[a] == p[a] for a in _ATTR_VOCAB) for o in objects] for p in phrases
    ]  # (phrases, objects)
    if spec["exact_count"] and any(sum(row) != p["count"] for row, p in zip(fits, phrases)):
        return False
    slots = [fits[i] for i, p in enumerate(phrases) for _ in range(p["count"])]
    if len(slots) > len(objects) or not _perfect_matching(slots):
        return False
    rel = spec["relation"]
    if rel is None:
        return True
    margin = RELATION_MARGIN * image_size
    return any(
        i != j
        and fits[rel["a"]][i]
        and fits[rel["b"]][j]
        and relation_holds(objects[i]["centroid"], objects[j]["centroid"], rel["type"], margin)
        for i in range(len(objects))
        for j in range(len(objects))
    )


def _perfect_matching(slots: list[list[bool]]) -> bool:
    """Can every slot take a distinct object it fits? (Kuhn's augmenting paths; slots x objects is tiny.)"""
    owner: dict[int, int] = {}  # object -> slot

    def place(slot: int, seen: set[int]) -> bool:
        for obj, ok in enumerate(slots[slot]):
            if ok and obj not in seen:
                seen.add(obj)
                if obj not in owner or place(owner[obj], seen):
                    owner[obj] = slot
                    return True
        return False

    return all(place(slot, set()) for slot in range(len(slots)))


def hard_negatives(
    scene: Scene, spec: dict, rng: np.random.Generator, world_cfg: WorldConfig, k: int
) -> list[tuple[str, dict]]:
    """Up to `k` (swap type, spec) pairs false of `scene`, with distinct captions, types round-robin.

    The round starts with the compositional swaps (`COMPOSITIONAL_SWAPS`, random order), then the
    others: a swap that brings in a colour, shape or count absent from the scene is already
    ruled out by the in-batch contrast, whereas only a hard negative teaches which attribute
    belongs to which object and which object stands where.
    """
    objects = scene_objects(scene)
    true_text = prompt_for_spec(spec)
    pools = {t: swap_candidates(spec, t, world_cfg) for t in SWAP_TYPES}
    first = [t for t in SWAP_TYPES if t in COMPOSITIONAL_SWAPS]
    rest = [t for t in SWAP_TYPES if t not in COMPOSITIONAL_SWAPS]
    order = [group[i] for group in (first, rest) for i in rng.permutation(len(group)).tolist() if pools[group[i]]]
    negatives: list[tuple[str, dict]] = []
    seen = {true_text}
    while len(negatives) < k and order:
        for kind in list(order):
            if len(negatives) == k:
                break
            pool = pools[kind]
            while pool:  # draw without replacement until one is false of the scene
                cand = pool.pop(int(rng.integers(len(pool))))
                text = prompt_for_spec(cand)
                if text not in seen and not spec_is_true(cand, objects, world_cfg.image_size):
                    negatives.append((kind, cand))
                    seen.add(text)
                    break
            if not pool:
                order.remove(kind)
    return negatives


def one_negative(scene: Scene, spec: dict, kind: str, rng: np.random.Generator, world_cfg: WorldConfig) -> str | None:
    """One random `kind` swap of `spec` that is false of `scene`, or None if there is none."""
    objects = scene_objects(scene)
    pool = swap_candidates(spec, kind, world_cfg)
    for i in rng.permutation(len(pool)).tolist():
        if not spec_is_true(pool[i], objects, world_cfg.image_size):
            return prompt_for_spec(pool[i])
    return None
