"""Prompt suites: balanced over categories, train / val / eval disjoint, eval with unseen combinations.

A suite file is JSONL, one record per line: {"prompt": ..., "category": ..., "spec": {...}}.
Train and val never bind a held-out (colour, shape) pair (`WorldConfig.heldout_pairs`); about half
of each eval category that can name colours does, like T2I-CompBench's val_unseen. The three
splits are disjoint in prompt text and in `canonical_key` (word order and mirrored relations).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from margrpo.io import atomic_write_text
from margrpo.world.captions import caption_scene, canonical_key, heldout_in_spec, validate_spec
from margrpo.world.config import CATEGORIES, WorldConfig
from margrpo.world.scene import ObjectSpec, Scene, sample_scene

SPLITS = ("train", "val", "eval")
NAME_MAX = 255  # bytes in a file name (ext4, xfs, btrfs, tmpfs): samples are {prompt}_{index:06d}.png


def prompt_problem(prompt: str) -> str | None:
    """Why a prompt cannot name its sample files ({prompt}_{index:06d}.png), or None if it can."""
    if "_" in prompt or "/" in prompt:
        return "contains '_' or '/': a prompt must be without '_' and '/' (sample file names are {prompt}_{index:06d}.png)"
    if any(ord(c) < 32 or ord(c) == 127 for c in prompt):
        return "contains a NUL or another control character"
    if len(prompt.encode()) > NAME_MAX - 11:
        return f"is {len(prompt.encode())} bytes; sample file names ({{prompt}}_{{index:06d}}.png) allow {NAME_MAX - 11}"
    return None
_MAX_TRIES = 5000  # consecutive draws without a new prompt before a category counts as exhausted


@dataclass(frozen=True)
class PromptRecord:
    prompt: str
    category: str
    spec: dict


def sample_captioned(rng: np.random.Generator, cfg: WorldConfig, category: str | None = None, allow_heldout: bool = False):
    """(scene, prompt, category, spec): a random scene and a caption of `category` (uniform if None).

    Draws the number of objects the category needs (spatial: 2; complex: >= 2), so categories stay
    balanced; this is also the sampler for (image, caption) pre-training pairs."""
    category = category or CATEGORIES[int(rng.integers(len(CATEGORIES)))]
    low, high = {"spatial": (2, 2), "complex": (2, cfg.max_objects)}.get(category, (1, cfg.max_objects))
    if high < low or (category == "spatial" and cfg.snap and cfg.grid < 2):
        raise ValueError(f"category {category!r} needs {low} objects side by side; raise max_objects / grid")
    for _ in range(_MAX_TRIES):
        scene = sample_scene(rng, cfg, n_objects=int(rng.integers(low, high + 1)), allow_heldout=allow_heldout)
        try:
            prompt, category, spec = caption_scene(scene, rng, category)
        except ValueError:
            continue
        return scene, prompt, category, spec
    raise RuntimeError(f"no {category} caption in {_MAX_TRIES} scenes")


def _with_heldout_pair(scene: Scene, rng, cfg: WorldConfig) -> Scene:
    """The scene with one random object given a random held-out (colour, shape) pair."""
    pairs = sorted(cfg.heldout_pairs())
    color, shape = pairs[int(rng.integers(len(pairs)))]
    objs = list(scene.objects)
    k = int(rng.integers(len(objs)))
    o = objs[k]
    objs[k] = ObjectSpec(color, shape, o.texture, o.size, o.cx, o.cy)
    return Scene(tuple(objs))


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
                    if misses > _MAX_TRIES:
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


def write_suite(records: list[PromptRecord], path: str | Path) -> Path:
    """JSONL, one {"prompt", "category", "spec"} per line; written atomically (temp file + rename)."""
    lines = (json.dumps({"prompt": r.prompt, "category": r.category, "spec": r.spec}) for r in records)
    return atomic_write_text(path, "".join(line + "\n" for line in lines))


def load_suite(path: str | Path) -> list[PromptRecord]:
    """Read a suite file; a malformed line raises ValueError naming the file and line number."""
    from margrpo.prompt_files import FILE_CATEGORIES, SOURCES  # here: prompt_files imports this module

    path = Path(path)
    records, prompts = [], {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(rec, dict) or not {"prompt", "category", "spec"} <= set(rec):
                raise ValueError(f"{where}: expected an object with keys prompt, category, spec")
            prompt, category = rec["prompt"], rec["category"]
            if not isinstance(prompt, str) or not prompt:
                raise ValueError(f"{where}: prompt must be a non-empty string; got {prompt!r}")
            if prompt_problem(prompt):
                raise ValueError(f"{where}: prompt {prompt[:60]!r}... {prompt_problem(prompt)}")
            if isinstance(rec["spec"], dict) and "source" in rec["spec"]:  # a real-prompt suite (margrpo.prompt_files)
                if rec["spec"]["source"] not in SOURCES or category not in FILE_CATEGORIES:
                    raise ValueError(f"{where}: spec source {rec['spec']['source']!r} / category {category!r}; "
                                     f"expected a source in {SOURCES} and a category in {FILE_CATEGORIES}")
            else:
                if category not in CATEGORIES:
                    raise ValueError(f"{where}: unknown category {category!r}; expected one of {CATEGORIES}")
                try:
                    validate_spec(rec["spec"])
                except ValueError as err:
                    raise ValueError(f"{where}: {err}") from None
            if prompt in prompts:
                raise ValueError(f"{where}: prompt {prompt!r} repeats line {prompts[prompt]}; prompts must be unique")
            prompts[prompt] = lineno
            records.append(PromptRecord(prompt, category, rec["spec"]))
    if not records:
        raise ValueError(f"{path}: no records")
    return records
