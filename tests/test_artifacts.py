"""Issue #26.6: Fig. 6's grid artifacts as a number: background high-frequency energy, paired by image."""

import math

import numpy as np
import pytest
from PIL import Image

from margrpo.reporting.artifacts import artifacts, background_energy
from margrpo.world import WorldConfig, render, sample_scene

CFG = WorldConfig(image_size=64, grid=4)


def scene_image(seed: int) -> np.ndarray:
    return render(sample_scene(np.random.default_rng(seed), CFG), CFG)


def with_grid(image: np.ndarray, amplitude: int = 30) -> np.ndarray:
    """A faint pattern on the 16-px token borders, the kind end-to-end GRPO's samples showed."""
    out = image.astype(np.int16)
    out[::16, :] += amplitude
    out[:, ::16] += amplitude
    return out.clip(0, 255).astype(np.uint8)


def test_a_clean_background_scores_near_zero_and_a_grid_far_above_it():
    clean = scene_image(0)
    assert (
        background_energy(clean, CFG.palette) < 1e-4
    )  # dim anti-aliasing fringes just below the foreground threshold
    assert background_energy(with_grid(clean), CFG.palette) > 30 * background_energy(clean, CFG.palette)
    assert background_energy(np.zeros((16, 16, 3), np.uint8), CFG.palette) == 0.0
    assert math.isnan(background_energy(np.full((16, 16, 3), 255, np.uint8), ("red",)))  # no background at all


def write_samples(root, run, images):
    folder = root / "samples" / run / "samples"
    folder.mkdir(parents=True)
    for i, im in enumerate(images):
        Image.fromarray(im).save(folder / f"prompt {i}_000000.png")


def test_the_report_finds_the_method_with_the_grid(tmp_path):
    images = [scene_image(i) for i in range(6)]
    write_samples(tmp_path, "base/p", images)
    for s in range(3):
        write_samples(tmp_path, f"train/p/r/grpo/seed{s}", [with_grid(im, 20 + 5 * s) for im in images])
        write_samples(tmp_path, f"train/p/r/fix/seed{s}", images)
    runs = [f"train/p/r/{v}/seed{s}" for v in ("grpo", "fix") for s in range(3)]
    data = artifacts(tmp_path, {"base": ["base/p"], "runs": runs}).data.set_index(["method", "reference"])
    assert data.loc[("GRPO", "base"), "verdict"] == "reproduced" and data.loc[("GRPO", "base"), "n_images"] == 18
    assert data.loc[("GRPO", "+Fix*"), "lo"] > 0
    assert data.loc[("+Fix", "base"), "diff"] == pytest.approx(0.0, abs=1e-12)
    assert data.loc[("+Fix", "base"), "verdict"] == "not settled" and (data["no_background"] == 0).all()


def test_an_image_without_background_is_counted_not_compared(tmp_path):
    images = [scene_image(i) for i in range(4)]
    write_samples(tmp_path, "base/p", images)
    noise = np.random.default_rng(0).integers(
        60, 255, (64, 64, 3), dtype=np.uint8
    )  # every pixel bright: no background
    write_samples(tmp_path, "train/p/r/grpo/seed0", [noise] + images[1:])
    row = artifacts(tmp_path, {"base": ["base/p"], "runs": ["train/p/r/grpo/seed0"]}).data.iloc[0]
    assert row["no_background"] == 1 and row["n_images"] == 3 and row["diff"] == pytest.approx(0.0, abs=1e-12)
