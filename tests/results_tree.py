"""A synthetic results tree for the reporting tests (no training: every number is planted here). The `tree` fixture
(tests/conftest.py) writes it once per test module."""

from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from margrpo.infra.files import atomic_write_json

POLICY, REWARD = "toy-nova", "toyclip"
VARIANTS = ["grpo", "fix", "mte", "sim"]
SEEDS = [0, 1, 2]
CATEGORIES = ["color", "shape", "2d-spatial"]
PROMPTS = ["a red circle", "two blue squares", "a green_striped triangle"]  # `_` inside a prompt
BASE_VAL = 0.33
ABLATION_POINTS = [(0.0, 0.0, 4), (0.3, 0.0, 4), (0.5, 0.0, 4), (0.3, 0.1, 4), (0.3, 0.0, 2)]


def planted_strict(variant: str, seed: int, cat: int) -> float:
    """A planted CompBench score: distinct per variant, seed and category."""
    return 0.3 + 0.1 * (VARIANTS.index(variant) + 1 if variant in VARIANTS else 0) + 0.01 * seed**2 + 0.02 * cat


def write_eval(root, run, strict, pref, overall=False):
    folder = root / "eval" / run
    folder.mkdir(parents=True)
    rows = [
        {"category": c, "n_images": 4 * (i + 1), "strict": s, "lenient": s + 0.1}
        for i, (c, s) in enumerate(zip(CATEGORIES, strict))
    ]
    if overall:
        rows.append({"category": "overall", "n_images": 24, "strict": 0.5, "lenient": 0.6})
    pd.DataFrame(rows).to_csv(folder / "compbench.csv", index=False)
    pd.DataFrame(
        [
            {"scorer": "toyclip", "mean": pref, "std": 0.1, "n": 12},
            {"scorer": "shapes", "mean": pref / 2, "std": 0.1, "n": 12},
        ]
    ).to_csv(folder / "preference.csv", index=False)


def write_samples(root, run, shade):
    folder = root / "samples" / run / "samples"
    folder.mkdir(parents=True)
    for p, prompt in enumerate(PROMPTS):
        for index in (0, 1):
            img = np.full((32, 32, 3), (shade * 37 + p * 60 + index) % 256, dtype=np.uint8)
            img[8:24, 8:24, p % 3] = 255
            Image.fromarray(img).save(folder / f"{prompt}_{index:06d}.png")


def write_metrics(root, run, scale, steps=12, drop=()):
    rng = np.random.default_rng(int(scale * 1000))
    step = np.arange(1, steps + 1)
    df = pd.DataFrame(
        {
            "step": step,
            "reward_mean": 0.3 + 0.02 * step * scale + 0.01 * rng.standard_normal(steps),
            "reward_std": 0.1,
            "adv_mean": 0.0,
            "adv_std": 1.0,
            "frac_zero_std": 0.0,
            "policy_loss": 0.01,
            "kl": 1e-3 * step,
            "clip_frac": 0.05,
            "ratio_min": 0.9,
            "ratio_max": 1.1,
            "grad_norm_ar": scale * (1 + rng.random(steps)),
            "grad_var_ar": scale * 1e-3 * (1 + rng.random(steps)),
            "lr": 1e-4,
            "wall_time_s": step * 2.0,
            "peak_mem_mb": 100.0,
            "skipped": 0,
            "val_reward": np.where(step % 4 == 0, 0.3 + 0.01 * step * scale, np.nan),
            "reward/toyclip": 0.3,
        }
    ).drop(columns=list(drop))
    (root / run).mkdir(parents=True, exist_ok=True)
    df.to_csv(root / run / "metrics.csv", index=False)


def write_tree(root: Path) -> dict:
    """The tree under `root`: the base policy, 4 variants x 3 seeds (evaluations, metrics, selections, samples of
    seed 0), the 5 ablation points x 2 seeds and uncertainty maps; returns the root and the run ids of each kind."""
    write_eval(root, f"base/{POLICY}", [0.2, 0.25, 0.3], 0.1)
    write_samples(root, f"base/{POLICY}", 0)
    runs = []
    for v in VARIANTS:
        for s in SEEDS:
            run = f"train/{POLICY}/{REWARD}/{v}/seed{s}"
            runs.append(run)
            write_eval(
                root, run, [planted_strict(v, s, c) for c in range(3)], 0.2 + 0.1 * VARIANTS.index(v) + 0.01 * s
            )
            write_metrics(root, run, 1.0 + VARIANTS.index(v) + 0.1 * s, drop=("clip_frac",) if v == "mte" else ())
            atomic_write_json(root / run / "summary.json", {"base_val_reward": BASE_VAL, "checkpoints": []})
            rule, step = ("best", 8) if v in ("grpo", "fix") else ("fixed", 12)
            atomic_write_json(
                root / "select" / run / "selection.json",
                {"policy": f"{run}/ckpt/policy", "step": step, "rule": rule, "val_reward": 0.4, "candidates": []},
            )
            if s == 0:
                write_samples(root, run, VARIANTS.index(v) + 1)
    ablation = []
    for k, tau, S in ABLATION_POINTS:
        for s in (0, 1):
            run = f"ablation/{POLICY}/{REWARD}/top_frac~{k}_tau~{tau}_trajectories~{S}/seed{s}"
            ablation.append(run)
            write_eval(root, run, [0.4 + k / 4 - tau + S / 100 + 0.01 * s] * 3, 0.3 + k / 10 + 0.005 * s)
            write_metrics(root, run, 1.0 + k + 0.1 * s, steps=30)
            write_samples(root, run, int(10 * k) + S)
    (root / "uncertainty").mkdir()
    rng = np.random.default_rng(0)
    np.savez(
        root / "uncertainty" / "maps.npz",
        images=rng.integers(0, 255, (2, 32, 32, 3), dtype=np.uint8),
        uncertainty=rng.random((2, 8, 8), dtype=np.float32),
        prompts=np.array(PROMPTS[:2]),
        trajectories=rng.integers(0, 255, (2, 3, 32, 32, 3), dtype=np.uint8),
    )
    return {"root": root, "runs": runs, "ablation": ablation, "base": [f"base/{POLICY}"]}
