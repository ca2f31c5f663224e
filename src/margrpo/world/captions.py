"""Prompt specs, T2I-CompBench-style captions, and scenes drawn to satisfy a spec.

A **spec** is the JSON-serialisable statement of what a prompt asks; the prompt text is a
deterministic function of it (`prompt_for_spec`), and the scorer reads only the spec:

    {
      "objects": [                      # noun phrases; null attributes are unconstrained
        {"color": "red" | null, "shape": "circle" | null, "texture": "hollow" | null, "count": 1},
        ...
      ],
      "relation": null | {"type": "left of" | "right of" | "above" | "below" | "next to",
                          "a": 0, "b": 1},          # objects[a] <type> objects[b]
      "exact_count": false                          # true: each phrase's count is exact (numeracy)
    }

With `exact_count` false a phrase with count n asks for n distinct matching objects (attribute
binding); with true, the image must hold exactly n objects matching each phrase, so phrases must
be disjoint (differ in an attribute both specify). A relation joins exactly two phrases of count 1.

Examples (category: prompt):
    color:    "a red circle and a blue square"
    shape:    "a circle, a green triangle and a square"
    texture:  "a hollow triangle and a solid red circle"
    spatial:  "a red circle on the left of a square"
    numeracy: "two circles and one red square", "three triangles"
    complex:  "a hollow red circle and a solid blue square" (colour + texture binding),
              "a solid green triangle above a blue circle" (binding + relation),
              "two red circles and one blue square" (count + colour)
"""

from __future__ import annotations

import json

import numpy as np

from margrpo.world.config import CATEGORIES, PALETTE, RELATIONS, SHAPES, TEXTURES, WorldConfig
from margrpo.world.scene import (
    ObjectSpec,
    Scene,
    clear_relations,
    place,
    sample_attributes,
    sample_backdrop,
    sample_scene,
)

ATTRS = ("color", "shape", "texture")
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
RELATION_PHRASES = {
    "left of": "on the left of",
    "right of": "on the right of",
    "above": "above",
    "below": "below",
    "next to": "next to",
}
_MIRROR = {"right of": "left of", "below": "above"}  # canonical direction of each mirrored relation


# ---------------------------------------------------------------- validation and text


def validate_spec(spec, cfg: WorldConfig | None = None) -> None:
    """Raise ValueError saying what is wrong with `spec` (vocabulary from `cfg`, else every known value)."""
    vocab = {
        "color": cfg.palette if cfg else tuple(PALETTE),
        "shape": cfg.shapes if cfg else SHAPES,
        "texture": cfg.textures if cfg else TEXTURES,
    }
    if not isinstance(spec, dict) or set(spec) != {"objects", "relation", "exact_count"}:
        raise ValueError(f"spec must be a dict with keys objects, relation, exact_count; got {spec!r}")
    objects = spec["objects"]
    if not isinstance(objects, list) or not objects:
        raise ValueError("spec objects must be a non-empty list")
    for i, obj in enumerate(objects):
        if not isinstance(obj, dict) or set(obj) != {*ATTRS, "count"}:
            raise ValueError(f"spec object {i} must have keys color, shape, texture, count; got {obj!r}")
        for attr in ATTRS:
            if obj[attr] is not None and obj[attr] not in vocab[attr]:
                raise ValueError(
                    f"spec object {i}: unknown {attr} {obj[attr]!r}; expected one of {vocab[attr]} or null"
                )
        if not isinstance(obj["count"], int) or isinstance(obj["count"], bool) or not 1 <= obj["count"] < len(NUMBERS):
            raise ValueError(f"spec object {i}: count must be an int in 1..{len(NUMBERS) - 1}, got {obj['count']!r}")
    total = sum(o["count"] for o in objects)
    if cfg is not None and total > cfg.max_objects:
        raise ValueError(f"spec asks for {total} objects, more than max_objects={cfg.max_objects}")
    if not isinstance(spec["exact_count"], bool):
        raise ValueError(f"spec exact_count must be true or false, got {spec['exact_count']!r}")
    if spec["exact_count"]:
        for i in range(len(objects)):
            for j in range(i):
                if not _disjoint(objects[i], objects[j]):
                    raise ValueError(
                        f"spec objects {j} and {i} overlap, so exact counts are ambiguous; "
                        "make them differ in an attribute both set"
                    )
    rel = spec["relation"]
    if rel is not None:
        if not isinstance(rel, dict) or set(rel) != {"type", "a", "b"} or rel["type"] not in RELATIONS:
            raise ValueError(f"spec relation must be null or {{type, a, b}} with type in {RELATIONS}; got {rel!r}")
        if len(objects) != 2 or {rel["a"], rel["b"]} != {0, 1} or any(o["count"] != 1 for o in objects):
            raise ValueError("a spec relation must join objects 0 and 1, the only two objects, each of count 1")
        if _descriptor(objects[0]) == _descriptor(objects[1]):
            raise ValueError(
                "the two objects of a relation must differ in some attribute, or the relation is ambiguous"
            )


def _descriptor(obj: dict) -> tuple:
    return tuple(obj[a] for a in ATTRS)


def _disjoint(p: dict, q: dict) -> bool:
    """No object can match both phrases: some attribute is set in both and differs."""
    return any(p[a] is not None and q[a] is not None and p[a] != q[a] for a in ATTRS)


def _noun_phrase(obj: dict, exact: bool) -> str:
    n = obj["count"]
    noun = (obj["shape"] or "object") + ("s" if n > 1 else "")
    words = [w for w in (obj["texture"], obj["color"], noun) if w]
    if n > 1 or exact:
        det = NUMBERS[n]
    else:
        det = "an" if words[0][0] in "aeiou" else "a"
    return " ".join([det, *words])


def prompt_for_spec(spec: dict) -> str:
    """The caption of a spec, e.g. "a hollow red circle on the left of two squares"."""
    phrases = [_noun_phrase(o, spec["exact_count"]) for o in spec["objects"]]
    rel = spec["relation"]
    if rel is not None:
        return f"{phrases[rel['a']]} {RELATION_PHRASES[rel['type']]} {phrases[rel['b']]}"
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]


def canonical_key(spec: dict) -> str:
    """Order-free identity of a spec: "a red circle and a square" == "a square and a red circle",
    "A on the right of B" == "B on the left of A". Suites are disjoint in these keys, not just in text."""
    objects = [dict(o) for o in spec["objects"]]
    rel = spec["relation"]
    if rel is None:
        objects.sort(key=lambda o: json.dumps(o, sort_keys=True))
        return json.dumps({"objects": objects, "relation": None, "exact_count": spec["exact_count"]}, sort_keys=True)
    a, b, kind = rel["a"], rel["b"], rel["type"]
    if kind in _MIRROR:
        a, b, kind = b, a, _MIRROR[kind]
    pair = [objects[a], objects[b]]
    if kind == "next to":
        pair.sort(key=lambda o: json.dumps(o, sort_keys=True))
    return json.dumps({"objects": pair, "relation": kind, "exact_count": spec["exact_count"]}, sort_keys=True)


def heldout_in_spec(spec: dict, pairs) -> bool:
    """Does any phrase bind a held-out (colour, shape) pair?"""
    return any((o["color"], o["shape"]) in pairs for o in spec["objects"])


def prompt_vocabulary(cfg: WorldConfig | None = None) -> list[str]:
    """Every word (and the comma) a prompt of this world can contain, for word-level tokenizers."""
    cfg = cfg or WorldConfig()
    nouns = [*cfg.shapes, "object"]
    words = {"a", "an", "and", ",", *NUMBERS[1:], *cfg.palette, *cfg.textures, *nouns, *(n + "s" for n in nouns)}
    words |= {w for phrase in RELATION_PHRASES.values() for w in phrase.split()}
    return sorted(words)


# ---------------------------------------------------------------- captions of random scenes


def _phrase(obj: ObjectSpec, attrs) -> dict:
    return {a: (getattr(obj, a) if a in attrs else None) for a in ATTRS} | {"count": 1}


def _describe(
    objs, rng, required: tuple[str, ...], optional: tuple[str, ...] = (), p: float = 0.5
) -> list[dict] | None:
    """One phrase per object: the required attributes plus each optional one with probability p;
    objects that would read alike get all optional attributes. None if two still read alike."""
    chosen = [set(required) | {a for a in optional if rng.random() < p} for _ in objs]
    for _ in range(2):
        phrases = [_phrase(o, c) for o, c in zip(objs, chosen)]
        keys = [_descriptor(q) for q in phrases]
        clashing = [i for i, k in enumerate(keys) if keys.count(k) > 1]
        if not clashing:
            return phrases
        for i in clashing:
            chosen[i] |= set(optional)
    return None


def _spatial(scene: Scene, rng, required, optional, p) -> dict | None:
    if len(scene.objects) != 2:
        return None
    order = rng.permutation(2)
    a, b = (scene.objects[i] for i in order)
    slack = max(a.size, b.size) / 2  # the dominant axis must win by half an object
    relations = clear_relations(a.centroid, b.centroid, slack)
    phrases = _describe([a, b], rng, required, optional, p)
    if not relations or phrases is None:
        return None
    kind = relations[int(rng.integers(len(relations)))]
    return {"objects": phrases, "relation": {"type": kind, "a": 0, "b": 1}, "exact_count": False}


def _counts(scene: Scene, rng, keys: tuple[str, ...], p_color: float) -> dict:
    """Exact-count phrases grouping the objects by `keys`; a group of one colour names it with p_color."""
    groups: dict[tuple, list[ObjectSpec]] = {}
    for o in scene.objects:
        groups.setdefault(tuple(getattr(o, k) for k in keys), []).append(o)
    phrases = []
    for members in groups.values():
        colours = {o.color for o in members}
        attrs = set(keys) | ({"color"} if len(colours) == 1 and rng.random() < p_color else set())
        phrases.append(_phrase(members[0], attrs) | {"count": len(members)})
    return {"objects": phrases, "relation": None, "exact_count": True}


def _binding(phrases) -> dict | None:
    return None if phrases is None else {"objects": phrases, "relation": None, "exact_count": False}


def _several(spec: dict) -> dict | None:
    return spec if len(spec["objects"]) >= 2 else None


def _spec_for(scene: Scene, rng, category: str) -> dict | None:
    """A spec of `category` that is true of `scene` and mentions every object, or None if none fits."""
    objs = scene.objects
    if category == "color":
        return _binding(_describe(objs, rng, ("color", "shape")))
    if category == "shape":
        return _binding(_describe(objs, rng, ("shape",), ("color",)))
    if category == "texture":
        return _binding(_describe(objs, rng, ("texture", "shape"), ("color",), p=0.3))
    if category == "spatial":
        return _spatial(scene, rng, ("shape",), ("color",), 0.5)
    if category == "numeracy":
        return _counts(scene, rng, ("shape",), p_color=0.5)
    if category == "complex":  # two or more kinds of constraint at once
        if len(objs) < 2:
            return None
        options = [
            lambda: _binding(_describe(objs, rng, ("texture", "color", "shape"))),  # colour + texture binding
            lambda: _spatial(scene, rng, ("color", "shape"), ("texture",), 0.5),  # binding + relation
            lambda: _several(_counts(scene, rng, ("color", "shape"), p_color=0.0)),  # count + colour
        ]
        for i in rng.permutation(len(options)):
            if (spec := options[i]()) is not None:
                return spec
        return None
    raise ValueError(f"Unknown category: {category!r}; expected one of {CATEGORIES}")


def caption_scene(scene: Scene, rng: np.random.Generator, category: str | None = None) -> tuple[str, str, dict]:
    """(prompt, category, spec) describing every object of `scene`, in the style of `category`
    (or a random category that fits the scene). Raises ValueError when the category cannot describe
    the scene (e.g. spatial needs exactly two objects in a clear relation)."""
    if category is not None and category not in CATEGORIES:
        raise ValueError(f"Unknown category: {category!r}; expected one of {CATEGORIES}")
    candidates = [category] if category else [CATEGORIES[i] for i in rng.permutation(len(CATEGORIES))]
    for cat in candidates:
        spec = _spec_for(scene, rng, cat)
        if spec is not None:
            return prompt_for_spec(spec), cat, spec
    raise ValueError(f"no {category} caption fits a scene of {len(scene.objects)} objects; draw another scene")


# ---------------------------------------------------------------- scenes for a spec


def _cells_for_relation(rng, cfg: WorldConfig, kind: str, n: int) -> list[int]:
    """Grid cells for objects a, b (first two) in relation `kind`, then n - 2 other free cells."""
    g = cfg.grid
    line, (i, j) = int(rng.integers(g)), sorted(rng.choice(g, size=2, replace=False).tolist())
    if kind in ("left of", "right of", "next to"):
        a, b = line * g + i, line * g + j  # same row, a in the left column
    else:
        a, b = i * g + line, j * g + line  # same column, a in the upper row
    if kind in ("right of", "below") or (kind == "next to" and rng.random() < 0.5):
        a, b = b, a
    rest = [c for c in rng.permutation(g * g).tolist() if c not in (a, b)]
    return [a, b, *rest[: n - 2]]


def scene_for_spec(spec: dict, rng: np.random.Generator, cfg: WorldConfig) -> Scene:
    """A random scene that satisfies `spec` exactly: the asked objects and nothing else.

    Unconstrained attributes are drawn at random (never a held-out pair unless the spec names it).
    Exact counts stay exact because their phrases are disjoint (validated)."""
    validate_spec(spec, cfg)
    phrases = [o for o in spec["objects"] for _ in range(o["count"])]
    if cfg.snap and len(phrases) > cfg.grid**2:
        raise ValueError(f"spec asks for {len(phrases)} objects but the grid has {cfg.grid**2} cells")
    heldout, attrs = cfg.heldout_pairs(), []
    for phrase in phrases:
        for _ in range(100):  # a drawn colour / shape must not complete a held-out pair the phrase does not name
            drawn = dict(zip(ATTRS, sample_attributes(rng, cfg)))
            obj = {a: phrase[a] or drawn[a] for a in ATTRS}
            if (obj["color"], obj["shape"]) not in heldout or (phrase["color"] and phrase["shape"]):
                break
        attrs.append(obj)
    sizes = rng.integers(cfg.size_range[0], cfg.size_range[1] + 1, size=len(phrases)).tolist()
    rel = spec["relation"]
    if rel is None:
        centres = place(rng, cfg, sizes)
    elif cfg.snap:
        if cfg.grid < 2:
            raise ValueError("a relation needs grid >= 2")
        cells = _cells_for_relation(rng, cfg, rel["type"], len(phrases))
        if rel["a"] == 1:  # cells come as (a, b, ...), objects in spec order
            cells[0], cells[1] = cells[1], cells[0]
        centres = place(rng, cfg, sizes, cells)
    else:  # free placement: redraw until the relation holds with slack, between centres of mass

        def accept(pos):
            a, b = (
                ObjectSpec(**attrs[k], size=sizes[k], cx=pos[k][0], cy=pos[k][1]).centroid
                for k in (rel["a"], rel["b"])
            )
            return rel["type"] in clear_relations(a, b, max(sizes) / 2)

        centres = place(rng, cfg, sizes, accept=accept)
    objects = tuple(
        ObjectSpec(a["color"], a["shape"], a["texture"], int(s), x, y) for a, s, (x, y) in zip(attrs, sizes, centres)
    )
    return Scene(objects, sample_backdrop(rng, cfg))


MAX_TRIES = 5000  # consecutive draws without a new caption (or prompt) before giving up


def sample_captioned(
    rng: np.random.Generator, cfg: WorldConfig, category: str | None = None, allow_heldout: bool = False
):
    """(scene, prompt, category, spec): a random scene and a caption of `category` (uniform if None).

    Draws the number of objects the category needs (spatial: 2; complex: >= 2), so categories stay
    balanced; this is also the sampler for (image, caption) pre-training pairs."""
    category = category or CATEGORIES[int(rng.integers(len(CATEGORIES)))]
    low, high = {"spatial": (2, 2), "complex": (2, cfg.max_objects)}.get(category, (1, cfg.max_objects))
    if high < low or (category == "spatial" and cfg.snap and cfg.grid < 2):
        raise ValueError(f"category {category!r} needs {low} objects side by side; raise max_objects / grid")
    for _ in range(MAX_TRIES):
        scene = sample_scene(rng, cfg, n_objects=int(rng.integers(low, high + 1)), allow_heldout=allow_heldout)
        try:
            prompt, category, spec = caption_scene(scene, rng, category)
        except ValueError:
            continue
        return scene, prompt, category, spec
    raise RuntimeError(f"no {category} caption in {MAX_TRIES} scenes")
