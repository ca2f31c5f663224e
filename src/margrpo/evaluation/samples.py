"""The T2I-CompBench sample layout both evaluators read: `samples/{prompt}_{index:06d}.png`.

An evaluation reads a complete set (`complete_samples`): every prompt it evaluates, `images_per_prompt` times,
and nothing else; a folder with a file missing or one too many would give a mean over other images."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from margrpo.infra.files import InputError

_NAME = re.compile(r"^(?P<prompt>.+)_(?P<index>\d{6})\.png$")


@dataclass(frozen=True)
class Sample:
    path: Path
    prompt: str
    index: int


def parse_sample_name(name: str) -> tuple[str, int]:
    """`{prompt}_{index:06d}.png` -> (prompt, index); ValueError naming the file otherwise."""
    m = _NAME.match(name)
    if m is None:
        raise ValueError(f"{name!r}: sample file name is not {{prompt}}_{{index:06d}}.png")
    return m["prompt"], int(m["index"])


def list_samples(samples_dir: str | Path) -> list[Sample]:
    """The PNG samples of `samples_dir` (or of its `samples/` subfolder), sorted by file name."""
    root = Path(samples_dir)
    if (root / "samples").is_dir():
        root = root / "samples"
    if not root.is_dir():
        raise FileNotFoundError(f"samples directory {root} does not exist")
    files = sorted(root.glob("*.png"))
    if not files:
        raise ValueError(f"no PNG samples in {root}; expected files named {{prompt}}_{{index:06d}}.png")
    bad = [f.name for f in files if _NAME.match(f.name) is None]
    if bad:
        raise ValueError(f"{root}: {len(bad)} file name(s) are not {{prompt}}_{{index:06d}}.png, e.g. {bad[0]!r}")
    return [Sample(f, *parse_sample_name(f.name)) for f in files]


def evaluated_records(records: list, max_prompts: int) -> list:
    """The suite records `sample` draws and an evaluation reads: the first `max_prompts` (0: every one)."""
    if not isinstance(max_prompts, int) or max_prompts < 0:
        raise InputError(f"--max-prompts: {max_prompts}; expected 0 (every prompt of the suite) or a positive count")
    return records[:max_prompts] if max_prompts else records


def complete_samples(
    samples_dir: str | Path, prompts: list[str], images_per_prompt: int, suite: str | Path
) -> list[Sample]:
    """`list_samples` (in file-name order), checked to hold each of `prompts` (the suite's, or its first
    `--max-prompts`) exactly `images_per_prompt` times; InputError naming the first missing or extra file."""
    if images_per_prompt < 1:
        raise InputError(f"--images-per-prompt: {images_per_prompt}; expected at least 1")
    samples = list_samples(samples_dir)
    root = samples[0].path.parent
    by_name = {s.path.name: s for s in samples}
    wanted = set(prompts)
    suite_prompts = None
    for s in samples:
        if s.prompt not in wanted or s.index >= images_per_prompt:
            if s.prompt not in wanted:
                from margrpo.prompts.suites import load_suite

                suite_prompts = suite_prompts or {r.prompt for r in load_suite(suite)}
                why = (
                    f"prompt {s.prompt!r} is not in the suite {suite}"
                    if s.prompt not in suite_prompts
                    else f"prompt {s.prompt!r} is not among the {len(prompts)} evaluated prompts of {suite} "
                    "(--max-prompts)"
                )
            else:
                why = (
                    f"index {s.index} is past --images-per-prompt {images_per_prompt} "
                    f"(indices 0 to {images_per_prompt - 1})"
                )
            raise InputError(f"{s.path}: extra sample: {why}; the evaluation reads each prompt's images exactly once")
    for prompt in prompts:
        for index in range(images_per_prompt):
            name = f"{prompt}_{index:06d}.png"
            if name not in by_name:
                raise InputError(
                    f"{root / name}: missing; the evaluation needs {images_per_prompt} image(s) of each of "
                    f"the {len(prompts)} prompts of {suite} "
                    f"({len(samples)} of {len(prompts) * images_per_prompt} found)"
                )
    return samples
