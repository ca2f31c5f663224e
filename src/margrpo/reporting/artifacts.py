"""Fig. 6's background artifacts, measured: is the faint grid pattern in end-to-end GRPO's samples GRPO's alone?

Per image, the high-frequency energy of the background: the pixels the exact parser's colour classifier calls
background (`classify_pixels` == -1), eroded by one pixel so that the objects' anti-aliased edges do not count,
and the squared difference of each such pixel from its 3 x 3 neighbourhood mean, summed over RGB and averaged.
A clean ShapesWorld background scores 0; a patch-border grid or speckle scores above it. Every method's samples
come from the same evaluation prompts and fixed noise, so each is compared with the base policy and with +Fix*
image by image within a seed; the interval is the t-interval over seeds of the per-seed mean differences
(the paired bootstrap over images x seeds where there are fewer than 3 seeds), as in the claims report. An image
without a single clean background pixel has no energy: it is counted (`no_background`) and left out of the pairs.

    artifacts(root, {"base": ["base/toy-nova"], "runs": [ladder runs], "world": ".../world.json"}) -> ArtifactReport
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from margrpo.infra.files import atomic_write_csv, atomic_write_text, read_json
from margrpo.reporting.paired import MIN_SEEDS_FOR_T, decide, paired_summary
from margrpo.reporting.results import parse_run
from margrpo.reporting.tables import VARIANT_LABELS
from margrpo.world import WorldConfig
from margrpo.world.parser import classify_pixels

__all__ = ["background_energy", "artifacts", "ArtifactReport"]


def background_energy(image: np.ndarray, palette: tuple[str, ...]) -> float:
    """Mean high-frequency energy of an (H, W, 3) uint8 image's background (NaN when it has none)."""
    x = image.astype(np.float64) / 255.0
    bg = classify_pixels(image, palette) == -1
    padded = np.pad(bg, 1, constant_values=False)
    core = np.ones_like(bg)
    for dy in (0, 1, 2):  # a background pixel all of whose 8 neighbours are background too
        for dx in (0, 1, 2):
            core &= padded[dy : dy + bg.shape[0], dx : dx + bg.shape[1]]
    if not core.any():
        return math.nan
    p = np.pad(x, ((1, 1), (1, 1), (0, 0)), mode="edge")
    local = sum(p[dy : dy + x.shape[0], dx : dx + x.shape[1]] for dy in (0, 1, 2) for dx in (0, 1, 2)) / 9.0
    return float(((x - local) ** 2).sum(-1)[core].mean())


def _energies(root: Path, run: str, palette: tuple[str, ...]) -> pd.Series:
    from PIL import Image

    folder = root / "samples" / run / "samples"
    files = sorted(folder.glob("*.png"))
    if not files:
        raise ValueError(f"{folder}: no sample images (written by the sample rule)")
    return pd.Series({f.name: background_energy(np.asarray(Image.open(f).convert("RGB")), palette) for f in files})


@dataclass
class ArtifactReport:
    data: pd.DataFrame  # one row per (method, reference): mean energies and the paired difference
    confidence: float

    def to_markdown(self) -> str:
        out = [
            f"**Background artifacts (Fig. 6).** High-frequency energy of the background (x 1e4; 0 = a clean "
            "background), per image, on the evaluation prompts with fixed noise; differences paired by image within "
            f"each seed, {self.confidence:.0%} interval over seeds (bootstrap over images x seeds below "
            f"{MIN_SEEDS_FOR_T} seeds).",
            "",
            "| method | reference | seeds | images | images without background | method energy | reference energy "
            "| difference | CI | verdict (method > reference) |",
            "|:---|:---|---:|---:|---:|---:|---:|---:|:---|:---|",
        ]
        for r in self.data.to_dict("records"):
            ci = f"[{r['lo'] * 1e4:+.3f}, {r['hi'] * 1e4:+.3f}]" if math.isfinite(r["lo"]) else "–"
            out.append(
                f"| {r['method']} | {r['reference']} | {r['n_seeds']} | {r['n_images']} | {r['no_background']} | "
                f"{r['energy'] * 1e4:.3f} | {r['ref_energy'] * 1e4:.3f} | {r['diff'] * 1e4:+.3f} | {ci} | "
                f"{r['verdict']} |"
            )
        return "\n".join(out) + "\n"

    def write(self, prefix: str | os.PathLike, formats=()) -> list[Path]:
        """<prefix>.csv and .md (no figure: `formats` is unused)."""
        prefix = os.fspath(prefix)
        return [atomic_write_csv(self.data, f"{prefix}.csv"), atomic_write_text(f"{prefix}.md", self.to_markdown())]


def artifacts(root: str | Path, spec: dict, confidence: float = 0.95) -> ArtifactReport:
    root = Path(root)
    world = WorldConfig.from_dict(read_json(spec["world"])) if spec.get("world") else WorldConfig()
    runs = [parse_run(r) for r in spec.get("runs") or []]
    if not runs or not spec.get("base"):
        raise ValueError("report artifacts: the runs JSON needs 'base' and 'runs'")
    bases = {parse_run(b).policy: _energies(root, b, world.palette) for b in spec["base"]}
    by: dict[tuple[str, str], dict[int, pd.Series]] = {}
    for r in runs:
        by.setdefault((r.policy, r.variant), {})[r.seed] = _energies(root, r.run, world.palette)
    rows = []
    for (policy, variant), seeds in by.items():
        refs: list[tuple[str, dict[int, pd.Series]]] = [("base", {s: bases[policy] for s in seeds})]
        if variant != "fix" and (policy, "fix") in by:
            refs.append((VARIANT_LABELS["fix"] + "*", by[(policy, "fix")]))
        for ref_label, ref in refs:
            shared = sorted(set(seeds) & set(ref))
            d = paired_summary([(seeds[s] - ref[s]).dropna().to_numpy() for s in shared], confidence)  # by file name
            decided = decide(d)
            rows.append(
                {
                    "policy": policy,
                    "method": VARIANT_LABELS.get(variant, variant),
                    "reference": ref_label,
                    "n_seeds": d["n_seeds"],
                    "n_images": d["n_units"],
                    # an image with no clean background pixel at all has no energy: counted, not compared
                    "no_background": int(sum(seeds[s].isna().sum() for s in shared)),
                    "energy": float(np.nanmean([seeds[s].mean() for s in shared])),
                    "ref_energy": float(np.nanmean([ref[s].mean() for s in shared])),
                    "diff": d["diff"],
                    "lo": decided["lo"],
                    "hi": decided["hi"],
                    "verdict": decided["verdict"],
                }
            )
    return ArtifactReport(pd.DataFrame(rows), confidence)
