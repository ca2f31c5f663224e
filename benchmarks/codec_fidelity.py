"""Would a 16-channel token codec keep the toy world readable? Issue 43's fidelity gates for toy revision 4.

    python benchmarks/codec_fidelity.py --data results/data/shapesworld-<hash8> \
        --toypref results/toypref/toypref-<hash8>/model

A codec per 16 x 16 patch (768 channels -> `--channels`, default 16, the latent width of MAR's, NOVA's and Harmon's
VAEs): principal components of the training scenes' patches, fitted in float64 (mean + the top components; the
decoder is the transpose). It is measured on renders of the evaluation suite (one scene per prompt, as
`scene_for_spec` draws it, `--repeats` draws each) encoded and decoded:
- PSNR of the decoded render against the render;
- the parser: the share of decoded renders scored exactly 1 (strict) against their prompt's spec, beside the
  renders' own (gate: >= 99%);
- `backdrop_level` of decoded against original, in grey levels of 255 (gate: within one level);
- toypref's score of decoded against original renders, Pearson correlation (gate: >= 0.99).
Prints a table and, with --json, the numbers. No timing: fidelity only (the step cost is `step_profile.py`'s).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from margrpo.rewards.toypref import ToyPrefReward
from margrpo.stages.pretrain import load_world
from margrpo.world import score
from margrpo.world.captions import scene_for_spec
from margrpo.world.scene import backdrop_level, render


def patches(images: np.ndarray, p: int) -> np.ndarray:
    """(N, H, W, 3) -> (N * (H/p) * (W/p), p * p * 3), raster order."""
    n, h, w, c = images.shape
    x = images.reshape(n, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, p * p * c)


def unpatch(x: np.ndarray, n: int, h: int, w: int, p: int) -> np.ndarray:
    x = x.reshape(n, h // p, w // p, p, p, 3).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(n, h, w, 3)


class PCACodec:
    def __init__(self, train_patches: np.ndarray, channels: int):
        x = train_patches.astype(np.float64) / 255.0
        self.mean = x.mean(0)
        _, s, vt = np.linalg.svd(x - self.mean, full_matrices=False)
        self.basis = vt[:channels]  # [C, D]
        self.explained = float((s[:channels] ** 2).sum() / (s**2).sum())

    def encode(self, x: np.ndarray) -> np.ndarray:
        return (x.astype(np.float64) / 255.0 - self.mean) @ self.basis.T

    def decode(self, z: np.ndarray) -> np.ndarray:
        return np.clip(np.round((z @ self.basis + self.mean) * 255.0), 0, 255).astype(np.uint8)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def renders(records: list[dict], cfg, rng, repeats: int) -> tuple[np.ndarray, list[dict]]:
    images, rows = [], []
    for r in records:
        for _ in range(repeats):
            images.append(render(scene_for_spec(r["spec"], rng, cfg), cfg))
            rows.append(r)
    return np.stack(images), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="a data folder: world.json, train.jsonl, eval.jsonl")
    ap.add_argument("--toypref", help="a toypref model folder (the correlation gate is left out without one)")
    ap.add_argument("--channels", type=int, nargs="+", default=[16])
    ap.add_argument("--patch", type=int, default=16)
    ap.add_argument("--fit-scenes", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = Path(args.data)
    cfg = load_world(data / "world.json")
    rng = np.random.default_rng(args.seed)
    train = read_jsonl(data / "train.jsonl")
    fit = [train[i] for i in rng.integers(0, len(train), args.fit_scenes)]
    fit_images, _ = renders(fit, cfg, rng, 1)
    images, rows = renders(read_jsonl(data / "eval.jsonl"), cfg, rng, args.repeats)
    n, h, w, _ = images.shape
    strict = np.array([score(r["spec"], im, r["category"], cfg)["strict"] == 1 for r, im in zip(rows, images)])
    level = backdrop_level(images) * 255.0
    pref = ToyPrefReward(args.toypref) if args.toypref else None

    def preference(x: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0
        return pref(t, [r["prompt"] for r in rows], [{}] * len(rows)).numpy()

    base_pref = preference(images) if pref else None
    print(f"{n} renders of {len(rows) // args.repeats} evaluation prompts; codec fitted on {args.fit_scenes} scenes")
    print(f"renders themselves: parser strict {strict.mean():.4f}")
    header = f"{'channels':>8} {'explained':>9} {'PSNR dB':>8} {'strict':>7} {'backdrop max|d|':>15} {'toypref r':>9}"
    print(header)
    out = {"renders": n, "strict_renders": float(strict.mean()), "codecs": []}
    for c in args.channels:
        codec = PCACodec(patches(fit_images, args.patch), c)
        decoded = unpatch(codec.decode(codec.encode(patches(images, args.patch))), n, h, w, args.patch)
        mse = ((decoded.astype(np.float64) - images) ** 2).mean()
        psnr = 10 * np.log10(255.0**2 / mse)
        ok = np.array([score(r["spec"], im, r["category"], cfg)["strict"] == 1 for r, im in zip(rows, decoded)])
        dlevel = np.abs(backdrop_level(decoded) * 255.0 - level)
        r = float(np.corrcoef(base_pref, preference(decoded))[0, 1]) if pref else float("nan")
        row = dict(channels=c, explained=codec.explained, psnr=psnr, strict=float(ok.mean()))
        row.update(backdrop_max=float(dlevel.max()), backdrop_mean=float(dlevel.mean()), toypref_r=r)
        out["codecs"].append(row)
        print(f"{c:>8} {codec.explained:>9.5f} {psnr:>8.2f} {ok.mean():>7.4f} {dlevel.max():>15.2f} {r:>9.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
