"""What the Harmon-like base's head warm-up repairs, against the step its head stops learning at (issue 71 item 3).

For each `head_steps`, the real stages one after the other, as the pipeline runs them: `margrpo pretrain` of the
config's toy-harmon with that freeze step, then `margrpo warmup` (its config's warm-up). Prints one row per freeze
step from the warm-up's quality report, which holds the base's numbers before it: strict, seen single objects and
the share of images with no object of a palette colour (failed), before and after the warm-up, with each stage's
wall time. Runs `--jobs` freeze steps at a time, each in its own process (one thread on a CPU).

    python benchmarks/harmon_warmup.py --data results/data/shapesworld-<hash8> --head-steps 100 200 400 800 \
        --out /tmp/harmon-warmup [--steps 2400] [--config config/config.yaml] [--jobs 2] [--cpu]
"""

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from margrpo.experiment.config import load_config
from margrpo.experiment.specs import pretrain_settings


def stage(args: list[str], log: Path, env: dict) -> float:
    """One `margrpo` stage in its own process; its wall seconds (the log names the failure)."""
    t0 = time.time()
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "margrpo", *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:1])} failed (exit {done.returncode}): see {log}")
    return time.time() - t0


def one(head_steps: int, opts, policy: dict, warmup: dict, env: dict) -> dict:
    folder = Path(opts.out) / f"head{head_steps}"
    folder.mkdir(parents=True, exist_ok=True)
    spec = json.loads(json.dumps(policy))
    spec["pretrain"].update(steps=opts.steps, head_steps=head_steps)
    data = Path(opts.data)
    common = ["--world", str(data / "world.json"), "--eval-suite", str(data / "eval.jsonl"), "--precision", "no"]
    common += ["--threads", "1", "--quality-images", str(opts.quality_images)]
    pre_s = stage(
        ["pretrain", *common, "--policy-json", json.dumps(spec), "--out-dir", str(folder / "base" / "policy"),
         "--quality", str(folder / "base" / "quality.json")],
        folder / "pretrain.log",
        env,
    )  # fmt: skip
    warm_s = stage(
        ["warmup", *common, "--policy-dir", str(folder / "base" / "policy"), "--warmup-json", json.dumps(warmup),
         "--sampling-json", json.dumps(policy["sampling"]), "--out-dir", str(folder / "warm" / "policy"),
         "--quality", str(folder / "warm" / "quality.json")],
        folder / "warmup.log",
        env,
    )  # fmt: skip
    after = json.loads((folder / "warm" / "quality.json").read_text())
    before = after["before_warmup"]

    def read(q: dict) -> dict:
        return {
            "strict": q["overall"]["strict"],
            "shuffled": q["overall"]["shuffled_strict"],
            "seen_single": q["single_object_color_and_shape"]["seen_pairs"]["accuracy"],
            "failed": q["no_valid_object"],
        }

    return {"head_steps": head_steps, "steps": opts.steps, "before": read(before), "after": read(after),
            "pretrain_s": pre_s, "warmup_s": warm_s}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="the pipeline's data folder (world.json, eval.jsonl)")
    p.add_argument("--head-steps", type=int, nargs="+", required=True)
    p.add_argument("--steps", type=int, default=None, help="pre-training steps (default: the config's)")
    p.add_argument("--warmup-steps", type=int, default=None, help="warm-up steps (default: the config's)")
    p.add_argument("--quality-images", type=int, default=4, help="images per evaluation prompt (the stages' 4)")
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--policy", default="toy-harmon")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--cpu", action="store_true", help="hide the GPU from the stages (default: theirs, where one is)")
    p.add_argument("--out", required=True)
    opts = p.parse_args()
    config = load_config(opts.config)
    entry = config["policies"][opts.policy]
    policy, warmup = pretrain_settings(entry), dict(entry["warmup"])
    warmup["steps"] = opts.warmup_steps or warmup["steps"]
    opts.steps = opts.steps or policy["pretrain"]["steps"]
    env = dict(os.environ)
    if opts.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    Path(opts.out).mkdir(parents=True, exist_ok=True)
    print(f"{'head_steps':>10} | strict before -> after | seen single | failed images | pretrain s | warmup s")
    rows = []
    with ThreadPoolExecutor(opts.jobs) as pool:  # each row printed and kept as it finishes
        for r in as_completed([pool.submit(one, h, opts, policy, warmup, env) for h in opts.head_steps]):
            rows.append(r.result())
            Path(opts.out, "rows.json").write_text(json.dumps(sorted(rows, key=lambda r: r["head_steps"]), indent=1))
            r = rows[-1]
            pairs = (f"{share(r['before'][k])} -> {share(r['after'][k])}" for k in ("strict", "seen_single", "failed"))
            print(
                f"{r['head_steps']:>10} | {' | '.join(pairs)} | {r['pretrain_s']:.0f} | {r['warmup_s']:.0f}",
                flush=True,
            )


def share(value: float | None) -> str:
    """A quality share; n/a where the suite holds no prompt of its kind (seen single objects, on a small suite)."""
    return "n/a" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    main()
