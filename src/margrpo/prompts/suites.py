"""Prompt suites, whatever built them: the record, the suite file, its checks, and the trainer's PromptSet.

A suite is three JSONL files (train / val / eval), one {"prompt": ..., "category": ..., "spec": {...}}
per line. The toy world draws its own (`margrpo.prompts.shapesworld`) and real-scale suites come from prompt
files (`margrpo.prompts.files`); both are written and read back here, and every JSONL file of the
project is read through `read_jsonl`, so a bad line always names its file and line.

A record's `spec["source"]` picks the validator (`VALIDATORS`): ShapesWorld records carry none (their
spec is the scene the exact scorer checks), real prompts name the file format they came from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from margrpo.infra.files import InputError, atomic_write_text
from margrpo.world.captions import validate_spec
from margrpo.world.config import CATEGORIES

SPLITS = ("train", "val", "eval")
NAME_MAX = 255  # bytes in a file name (ext4, xfs, btrfs, tmpfs): samples are {prompt}_{index:06d}.png
COMPBENCH_CATEGORIES = ("color", "shape", "texture", "spatial", "3d_spatial", "non_spatial", "numeracy", "complex")
FILE_CATEGORIES = (*COMPBENCH_CATEGORIES, "object")  # the categories a real prompt can have
SOURCES = ("t2i-r1", "t2i-compbench", "text")  # spec["source"] of a real prompt: the file format it came from


@dataclass(frozen=True)
class PromptRecord:
    prompt: str
    category: str
    spec: dict


@dataclass
class PromptSet:
    """Prompts with the metadata the rewards need (spec, category)."""

    prompts: list[str]
    metadata: list[dict]

    def __len__(self):
        return len(self.prompts)


def prompt_problem(prompt: str) -> str | None:
    """Why a prompt cannot name its sample files ({prompt}_{index:06d}.png), or None if it can."""
    if "_" in prompt or "/" in prompt:
        return (
            "contains '_' or '/': a prompt must be without '_' and '/' "
            "(sample file names are {prompt}_{index:06d}.png)"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in prompt):
        return "contains a NUL or another control character"
    if len(prompt.encode()) > NAME_MAX - 11:
        return (
            f"is {len(prompt.encode())} bytes; sample file names ({{prompt}}_{{index:06d}}.png) allow {NAME_MAX - 11}"
        )
    return None


def text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file (a leading byte-order mark dropped); bad bytes name the line."""
    path = Path(path)
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(f"{path}:{lineno}: not valid UTF-8 ({err.reason} at byte {err.start})") from None
            yield lineno, line.removeprefix("\ufeff") if lineno == 1 else line


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json's object hook: a key given twice would keep its last value silently; refuse it."""
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def read_jsonl(path: str | Path) -> Iterator[tuple[int, object]]:
    """(line number, value) of each non-blank line of a JSON Lines file; a line that is not JSON, or
    an object that gives a key twice, raises InputError naming file:line. What a value must hold is the
    caller's check."""
    path = Path(path)
    for lineno, line in text_lines(path):
        if not line.strip():
            continue
        try:
            value = json.loads(line, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None
        except _DuplicateKey as err:
            raise InputError(
                f"{path}:{lineno}: key {err.args[0]!r} is given twice; JSON would keep the last silently"
            ) from None
        yield lineno, value


def _check_shapesworld(category, spec) -> None:
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; expected one of {CATEGORIES}")
    validate_spec(spec)


def _source_problem(source, category) -> str:
    return (
        f"spec source {source!r} / category {category!r}; "
        f"expected a source in {SOURCES} and a category in {FILE_CATEGORIES}"
    )


def _check_real(category, spec) -> None:
    if category not in FILE_CATEGORIES:
        raise ValueError(_source_problem(spec["source"], category))


# spec["source"] -> check of a record's category and spec (ValueError if they do not fit); None: no source.
VALIDATORS: dict[str | None, Callable[[str, dict], None]] = {
    None: _check_shapesworld,
    **dict.fromkeys(SOURCES, _check_real),
}


def validate_record(category, spec) -> None:
    """Check a record's category and spec with the validator of its source; an unknown source is an error."""
    if not (isinstance(spec, dict) and "source" in spec):
        return VALIDATORS[None](category, spec)
    source = spec["source"]
    check = VALIDATORS.get(source) if isinstance(source, str) else None
    if check is None:
        raise ValueError(_source_problem(source, category))
    check(category, spec)


def write_suite(records: list[PromptRecord], path: str | Path) -> Path:
    """JSONL, one {"prompt", "category", "spec"} per line; written atomically (temp file + rename)."""
    lines = (json.dumps({"prompt": r.prompt, "category": r.category, "spec": r.spec}) for r in records)
    return atomic_write_text(path, "".join(line + "\n" for line in lines))


def load_suite(path: str | Path) -> list[PromptRecord]:
    """Read a suite file; a malformed line raises ValueError naming the file and line number."""
    path = Path(path)
    records, first_line = [], {}
    for lineno, rec in read_jsonl(path):
        where = f"{path}:{lineno}"
        if not isinstance(rec, dict) or not {"prompt", "category", "spec"} <= set(rec):
            raise ValueError(f"{where}: expected an object with keys prompt, category, spec")
        prompt, category = rec["prompt"], rec["category"]
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"{where}: prompt must be a non-empty string; got {prompt!r}")
        if prompt_problem(prompt):
            raise ValueError(f"{where}: prompt {prompt[:60]!r}... {prompt_problem(prompt)}")
        try:
            validate_record(category, rec["spec"])
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        if prompt in first_line:
            raise ValueError(f"{where}: prompt {prompt!r} repeats line {first_line[prompt]}; prompts must be unique")
        first_line[prompt] = lineno
        records.append(PromptRecord(prompt, category, rec["spec"]))
    if not records:
        raise ValueError(f"{path}: no records")
    return records
