"""The T2I-CompBench sample layout both evaluators read: `samples/{prompt}_{index:06d}.png`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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
