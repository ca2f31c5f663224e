"""Rule-based prompt analysis: the objects, relations and counts a prompt asks for.

The real-scale rewards (`margrpo.rewards.real`) and the T2I-CompBench evaluator need the noun
phrases of a prompt (what VQA asks about), its 2-D relation and its object counts (what the
detector checks). T2I-CompBench gets them from spaCy, which is in neither environment; a small,
documented rule set stands in for it (`noun_phrases`, `parse_relation`, `parse_counts`). Where a
prompt's metadata carries the T2I-R1 fields (`task_type`, `nouns`, `attr_nouns`, `spatial_info`,
`numeracy_info`, as in `src/margrpo/data/mar-grpo/train_prompts.jsonl`), those are used instead
(`detection_task`, `vqa_phrases`). Pure text: no model, no torch.

The word rules (noun phrases, counts) are `margrpo.prompts.phrases`, re-exported here; this module
holds the relations and the tasks built on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from margrpo.prompts.phrases import noun_phrases, object_name, parse_counts, singular

__all__ = [
    "LOCALITIES",
    "RELATIONS",
    "DetectionTask",
    "Relation",
    "canonical_relation",
    "detection_task",
    "noun_phrases",
    "object_name",
    "parse_counts",
    "parse_relation",
    "singular",
    "vqa_phrases",
]

# ---------------------------------------------------------------------------- relations

# locality phrase -> canonical relation of obj1 to obj2 (T2I-CompBench / T2I-R1 wording and aliases)
LOCALITIES: dict[str, str] = {
    "on the left of": "left",
    "on the left side of": "left",
    "to the left of": "left",
    "left of": "left",
    "on the right of": "right",
    "on the right side of": "right",
    "to the right of": "right",
    "right of": "right",
    "on the top of": "above",
    "on top of": "above",
    "top of": "above",
    "above": "above",
    "on the bottom of": "below",
    "on bottom of": "below",
    "below": "below",
    "under": "below",
    "underneath": "below",
    "beneath": "below",
    "next to": "near",
    "near": "near",
    "on side of": "near",
    "on the side of": "near",
    "beside": "near",
}
RELATIONS = ("left", "right", "above", "below", "near")
_LOCALITY_RE = re.compile(
    r"\b(" + "|".join(re.escape(k) for k in sorted(LOCALITIES, key=len, reverse=True)) + r")\b", re.IGNORECASE
)


@dataclass(frozen=True)
class Relation:
    """`obj1` is `relation` of `obj2` (one of RELATIONS); names lower-cased, without determiners."""

    obj1: str
    relation: str
    obj2: str


def canonical_relation(locality: str) -> str | None:
    """T2I-R1 / T2I-CompBench locality wording -> one of RELATIONS, or None (e.g. "in front of")."""
    return LOCALITIES.get(" ".join(locality.lower().split()))


def parse_relation(prompt: str) -> Relation | None:
    """The first 2-D relation of a prompt: last noun phrase before the locality words, first after.

    "a bee on the right of a refrigerator" -> Relation("bee", "right", "refrigerator");
    "The red hat was on top of the brown coat rack." -> Relation("red hat", "above", "brown coat rack").
    None when no locality phrase of LOCALITIES occurs or a side has no noun phrase.
    """
    m = _LOCALITY_RE.search(prompt)
    if m is None:
        return None
    before, after = noun_phrases(prompt[: m.start()]), noun_phrases(prompt[m.end() :])
    if not before or not after:
        return None
    obj1, obj2 = object_name(before[-1]), object_name(after[0])
    if not obj1 or not obj2:
        return None
    return Relation(obj1, LOCALITIES[m.group(1).lower()], obj2)


# ---------------------------------------------------------------------------- detection tasks


@dataclass(frozen=True)
class DetectionTask:
    """What the detector checks in one image.

    kind: "spatial" (`relation` between two objects), "numeracy" (`counts`), or "presence"
    (each of `nouns` detected). `nouns` lists every object name to detect.
    """

    kind: str
    nouns: tuple[str, ...]
    relation: Relation | None = None
    counts: tuple[tuple[str, int], ...] = ()


_TASK_ALIASES = {"spatial": "spatial", "2d_spatial": "spatial", "2d-spatial": "spatial", "numeracy": "numeracy"}


def _task_of(meta: dict) -> str | None:
    task = meta.get("task_type") or meta.get("category")
    return str(task).lower() if task else None


def _presence_nouns(prompt: str, meta: dict) -> tuple[str, ...]:
    nouns = meta.get("nouns")
    if nouns:
        return tuple(dict.fromkeys(str(n).lower() for n in nouns))
    return tuple(dict.fromkeys(n for n in (object_name(p) for p in noun_phrases(prompt)) if n))


def detection_task(prompt: str, meta: dict | None = None) -> DetectionTask:
    """The detection check for a prompt: from T2I-R1 metadata when present, else the prompt rules.

    The task is the metadata's `task_type`/`category` when given ("spatial" and "numeracy" are
    detection tasks; any other task is "presence"); without one, a prompt with a locality phrase is
    spatial and one with a number is numeracy. A spatial/numeracy prompt whose objects cannot be
    parsed (or whose locality is not 2-D, e.g. "in front of") falls back to presence of its nouns.
    """
    meta = meta or {}
    task = _task_of(meta)
    kind = _TASK_ALIASES.get(task or "", "presence" if task else None)
    if kind in (None, "spatial"):
        info = meta.get("spatial_info")
        rel = None
        if info:
            relation = canonical_relation(str(info.get("locality", "")))
            if relation is not None:
                rel = Relation(str(info["obj1"]).lower(), relation, str(info["obj2"]).lower())
        else:
            rel = parse_relation(prompt)
        if rel is not None:
            return DetectionTask("spatial", tuple(dict.fromkeys([rel.obj1, rel.obj2])), relation=rel)
    if kind in (None, "numeracy"):
        info = meta.get("numeracy_info")
        counts = [(str(c["obj_name"]).lower(), int(c["num"])) for c in info] if info else parse_counts(prompt)
        if counts:
            return DetectionTask("numeracy", tuple(dict.fromkeys(n for n, _ in counts)), counts=tuple(counts))
    return DetectionTask("presence", _presence_nouns(prompt, meta))


# ---------------------------------------------------------------------------- VQA questions


def vqa_phrases(prompt: str, meta: dict | None = None, max_phrases: int = 8) -> list[str]:
    """The phrases asked about: metadata `attr_nouns` or `nouns` (T2I-R1) when given, else noun_phrases."""
    meta = meta or {}
    for key in ("attr_nouns", "nouns"):
        if meta.get(key):
            return [str(p) for p in meta[key]][:max_phrases]
    return noun_phrases(prompt, max_phrases)
