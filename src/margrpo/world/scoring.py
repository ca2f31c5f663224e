"""Verifiable CompBench-style score of one image against its prompt's spec.

Terms (each in [0, 1]; a term the spec does not ask is NaN):
- `binding`: every asked object (a phrase of count n gives n slots) is assigned to a distinct
  parsed object (Hungarian assignment); a slot earns 1 when the object has all its asked
  attributes, else 0.5 x the fraction it has (right colour, wrong shape still counts a little);
- `relation`: 1 if some pair of distinct parsed objects, one fully matching each side, stands in
  the asked relation (centroids, dominant axis, margin 5% of the width); 0.5 if such a pair only
  partly matches (e.g. the right colours in the right places, wrong shapes); else 0;
- `count` (exact_count): per phrase 1 if exactly n parsed objects match it, else
  0.5 x min(k, n) / max(k, n); averaged over phrases.

`lenient` is the mean of the asked terms (extras ignored); `strict` = lenient / (1 + extra_objects
+ 0.25 x fragments), extra_objects being parsed objects beyond the number asked and fragments the
specks below the object size, so spraying objects or fragments to hit the asked ones pays off only
in `lenient`. A render of the spec scores exactly 1 in both. Tables report `strict`.
"""

from __future__ import annotations

import math

import numpy as np

from margrpo.world.captions import ATTRS, validate_spec
from margrpo.world.config import CATEGORIES, WorldConfig
from margrpo.world.parser import parse
from margrpo.world.scene import relation_holds

FRAGMENT_WEIGHT = 0.25  # one fragment costs a quarter of an extra object in `strict`
RELATION_MARGIN = 0.05  # fraction of the image width the dominant axis must exceed


def _match(phrase: dict, obj: dict) -> tuple[int, int]:
    """(attributes asked, attributes the object has of them)."""
    asked = [a for a in ATTRS if phrase[a] is not None]
    return len(asked), sum(obj[a] == phrase[a] for a in asked)


def _credit(phrase: dict, obj: dict) -> float:
    n, k = _match(phrase, obj)
    return 1.0 if k == n else 0.5 * k / n


def score_objects(spec: dict, objects: list[dict], n_fragments: int, width: int) -> dict:
    """Score parsed `objects` (parse's dicts) against `spec`; see the module docstring."""
    from scipy.optimize import linear_sum_assignment  # lazy: scipy costs ~0.3 CPU-s to import

    phrases = spec["objects"]
    slots = [p for p in phrases for _ in range(p["count"])]
    credit = np.array([[_credit(s, o) for o in objects] for s in slots]).reshape(
        len(slots), len(objects)
    )  # (slots, objects)
    rows, cols = linear_sum_assignment(credit, maximize=True)
    binding = float(credit[rows, cols].sum()) / len(slots)
    terms = {"binding": binding, "relation": math.nan, "count": math.nan}

    rel = spec["relation"]
    if rel is not None:
        a, b = phrases[rel["a"]], phrases[rel["b"]]
        best = 0.0
        for i, oi in enumerate(objects):
            for j, oj in enumerate(objects):
                if i == j or not relation_holds(oi["centroid"], oj["centroid"], rel["type"], RELATION_MARGIN * width):
                    continue
                ci, cj = _credit(a, oi), _credit(b, oj)
                if ci == 1.0 and cj == 1.0:
                    best = 1.0
                elif ci > 0 and cj > 0:
                    best = max(best, 0.5)
        terms["relation"] = best

    if spec["exact_count"]:
        per_phrase = []
        for p in phrases:
            k, n = sum(_credit(p, o) == 1.0 for o in objects), p["count"]
            per_phrase.append(1.0 if k == n else 0.5 * min(k, n) / max(k, n))
        terms["count"] = float(np.mean(per_phrase))

    lenient = float(np.nanmean([terms["binding"], terms["relation"], terms["count"]]))
    extra = max(0, len(objects) - len(slots))
    strict = lenient / (1.0 + extra + FRAGMENT_WEIGHT * n_fragments)
    return {
        "strict": strict,
        "lenient": lenient,
        **terms,
        "n_objects": len(objects),
        "n_expected": len(slots),
        "extra_objects": extra,
        "fragments": n_fragments,
    }


def score(spec: dict, image: np.ndarray, category: str, cfg: WorldConfig | None = None) -> dict:
    """Parse `image` ((H, W, 3) uint8) and score it against `spec`. Returns a dict with
    strict, lenient, binding, relation, count (NaN when not asked), n_objects, n_expected,
    extra_objects, fragments. `category` is checked and only labels the result: the spec says what
    is asked."""
    if category not in CATEGORIES:
        raise ValueError(f"Unknown category: {category!r}; expected one of {CATEGORIES}")
    validate_spec(spec)
    objects, fragments = parse(image, cfg, return_fragments=True)
    return score_objects(spec, objects, len(fragments), image.shape[1])
