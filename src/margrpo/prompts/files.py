"""Prompt suites from real prompt files (real scale): the RL prompts and the T2I-CompBench splits.

The toy world draws its suites from ShapesWorld (`margrpo.prompts.shapesworld.build_suites`); at real scale
the suites come from files instead, in the same three-split JSONL layout (`margrpo.prompts.suites`):

- train: the RL prompts, JSON Lines in the T2I-R1 format (`prompt`, `task_type`, `nouns`,
  `spatial_info` / `numeracy_info` / `attr_nouns`) as in the shipped `RL_PROMPTS`, or a .txt file
  with one prompt per line, its category read from its name as the val file's (`color_train.txt`:
  color; no category in the name: object);
- eval: `<category>_val.txt` of the T2I-CompBench folder (the shipped `COMPBENCH_DIR`) for each
  evaluation category (the paper's 300-prompt splits);
- val (checkpoint selection, design.md §3.12): `val_file` if given, else `n_val` RL prompts held out
  (drawn with `seed`, spread over the task types) and removed from train. The CompBench
  `<category>_train.txt` splits cannot serve: the RL prompts already contain almost all of them.

Evaluation prompts that also occur in the RL file (2 spatial prompts of the paper's file) are
removed from train, so the three suites are disjoint.

A record's spec carries `"source"` ("t2i-r1", "t2i-compbench" or "text") and the file's metadata,
so detection- and VQA-based rewards can use the nouns and relations the prompt file states.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from margrpo.infra.files import InputError
from margrpo.prompts.suites import (
    COMPBENCH_CATEGORIES,
    FILE_CATEGORIES,
    SOURCES,
    PromptRecord,
    prompt_problem,
    read_jsonl,
    text_lines,
)

log = logging.getLogger(__name__)

__all__ = [
    "COMPBENCH_CATEGORIES",
    "FILE_CATEGORIES",
    "SOURCES",
    "TASK_TYPES",
    "DATA_DIR",
    "COMPBENCH_DIR",
    "RL_PROMPTS",
    "read_prompt_file",
    "compbench_file",
    "build_file_suites",
]

TASK_TYPES = {"non": "non_spatial", "object": "object"}  # T2I-R1 task_type -> our category (others map to themselves)
DATA_DIR = (
    Path(__file__).parents[1] / "data"
)  # package data (src/margrpo/data): provenance and licences in data/README.md
COMPBENCH_DIR = DATA_DIR / "t2i-compbench"  # T2I-CompBench's prompt lists (MIT)
RL_PROMPTS = DATA_DIR / "mar-grpo" / "train_prompts.jsonl"  # MAR-GRPO's 7,223 RL prompts (Apache-2.0)


def _check_prompt(prompt, where: str) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError(f"{where}: empty or non-string prompt {prompt!r}")
    prompt = prompt.strip()
    if prompt_problem(prompt):
        raise InputError(f"{where}: prompt {prompt[:60]!r} {prompt_problem(prompt)}")
    return prompt


def _t2i_r1_record(raw, category: str | None, where: str) -> PromptRecord:
    """A record of one T2I-R1 JSON line; its task_type names the category (`category` if it has none)."""
    if not isinstance(raw, dict) or "prompt" not in raw:
        raise InputError(f"{where}: expected an object with a 'prompt' key (T2I-R1 format)")
    task = raw.get("task_type", category)
    cat = TASK_TYPES.get(task, task)
    if cat not in FILE_CATEGORIES:
        raise InputError(
            f"{where}: unknown task_type {task!r}; expected one of {sorted({*FILE_CATEGORIES, *TASK_TYPES})}"
        )
    spec = {"source": "t2i-r1", **{k: v for k, v in raw.items() if k not in ("prompt", "task_type")}}
    return PromptRecord(_check_prompt(raw["prompt"], where), cat, spec)


def _text_records(path: Path, category: str | None):
    """Records of a .txt prompt file, one prompt per non-blank line, all of `category`."""
    for lineno, line in text_lines(path):
        if not line.strip():
            continue
        if category not in FILE_CATEGORIES:
            raise InputError(
                f"{path}: a .txt prompt file needs a category (one of {FILE_CATEGORIES}), got {category!r}"
            )
        source = "t2i-compbench" if category in COMPBENCH_CATEGORIES else "text"
        yield PromptRecord(_check_prompt(line, f"{path}:{lineno}"), category, {"source": source})


def read_prompt_file(path: str | Path, category: str | None = None) -> list[PromptRecord]:
    """Records of one prompt file: T2I-R1 JSON Lines (.jsonl) or plain text, one prompt per line (.txt).

    A malformed line raises InputError (a ValueError) naming the file and line; a repeated prompt
    keeps its first line.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {path} not found")
    if path.suffix == ".jsonl":
        read = (_t2i_r1_record(raw, category, f"{path}:{lineno}") for lineno, raw in read_jsonl(path))
    else:
        read = _text_records(path, category)
    records: dict[str, PromptRecord] = {}
    for record in read:
        records.setdefault(record.prompt, record)
    if not records:
        raise InputError(f"prompt file {path} holds no prompts")
    return list(records.values())


def compbench_file(eval_dir: str | Path, category: str, split: str) -> Path:
    if category not in COMPBENCH_CATEGORIES:
        raise ValueError(f"unknown T2I-CompBench category {category!r}; expected one of {COMPBENCH_CATEGORIES}")
    path = Path(eval_dir) / f"{category}_{split}.txt"
    if not path.is_file():
        raise FileNotFoundError(
            f"T2I-CompBench split {path} not found (prompts.eval_dir should hold <category>_{split}.txt)"
        )
    return path


def build_file_suites(
    train_file: str | Path,
    eval_dir: str | Path,
    categories: list[str],
    n_val: int,
    seed: int = 0,
    val_file: str | Path | None = None,
    n_eval: int | None = None,
) -> dict[str, list[PromptRecord]]:
    """train / val / eval suites from files; val and eval are disjoint from each other and from train.

    `n_eval` caps the evaluation prompts per category (None: the whole 300-prompt split).
    """
    train = read_prompt_file(train_file, _category_of(train_file) if Path(train_file).suffix != ".jsonl" else None)
    evaluation: list[PromptRecord] = []
    for cat in categories:
        evaluation += read_prompt_file(compbench_file(eval_dir, cat, "val"), cat)[:n_eval]
    evaluation = list({r.prompt: r for r in reversed(evaluation)}.values())[
        ::-1
    ]  # a prompt in two categories: first wins
    eval_prompts = {r.prompt for r in evaluation}
    overlap = [r for r in train if r.prompt in eval_prompts]
    if overlap:
        log.info(
            f"{train_file}: {len(overlap)} prompt(s) are evaluation prompts too; removed from train, "
            f"e.g. {overlap[0].prompt!r}"
        )
        train = [r for r in train if r.prompt not in eval_prompts]
    if val_file is not None:
        val = read_prompt_file(val_file, _category_of(val_file))
        clash = sorted({r.prompt for r in val} & (eval_prompts | {r.prompt for r in train}))
        if clash:
            raise ValueError(
                f"{val_file}: {len(clash)} validation prompt(s) are also training or evaluation prompts, "
                f"e.g. {clash[0]!r}; "
                "checkpoint selection needs disjoint prompts (design.md §3.12)"
            )
    else:
        if len(train) <= n_val:
            raise ValueError(
                f"{train_file}: {len(train)} prompts cannot spare {n_val} for validation; lower prompts.n_val"
            )
        by_task: dict[str, list[PromptRecord]] = {}
        for r in train:
            by_task.setdefault(r.category, []).append(r)
        rng = random.Random(seed)
        for records in by_task.values():
            rng.shuffle(records)
        val = []  # round-robin over task types: every type is represented
        while len(val) < n_val:
            for records in by_task.values():
                if records and len(val) < n_val:
                    val.append(records.pop())
        held = {r.prompt for r in val}
        train = [r for r in train if r.prompt not in held]
    return {"train": train, "val": val, "eval": evaluation}


def _category_of(path: str | Path) -> str:
    """`complex_val_spatial.txt` -> complex; `3d_spatial_train.txt` -> 3d_spatial; unknown -> 'object'."""
    stem = Path(path).stem
    for cat in sorted(COMPBENCH_CATEGORIES, key=len, reverse=True):
        if stem.startswith(cat):
            return cat
    return "object"
