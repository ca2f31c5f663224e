"""Quality of a toy base policy against pre-training length: the trade-off curve behind the default steps.

For each step count, trains a fresh policy (its own cosine schedule, the real `margrpo.toylab.pretraining`
code path) on the pipeline's world, then scores it on the evaluation suite with the ShapesWorld
scorer: single-object colour-AND-shape accuracy, strict score per category, shuffled-prompt
baseline. Prints one row per step count with the training wall time on this device.

    python benchmarks/pretrain_tradeoff.py --steps 500 1000 2000 --head flow
    python benchmarks/pretrain_tradeoff.py --steps 1000 --pretrain '{"mask_ratio_min": 0.0}' --out curve.json
    python benchmarks/pretrain_tradeoff.py --data results/data/shapesworld-<hash8> --steps 1600 \
        --model '{"latent_channels": 24}'      # the pipeline's world and evaluation suite; PCA latent tokens

With `latent_channels` > 0 the policy's PCA codec is fitted first, as the pretrain stage fits it.
"""

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch

from margrpo.evaluation.quality import quality_report
from margrpo.grpo.rollout import SamplingConfig
from margrpo.policy import ToyMAR, ToyMARConfig
from margrpo.policy.toy import count_parameters
from margrpo.prompts.shapesworld import build_suites
from margrpo.prompts.suites import load_suite
from margrpo.stages.pretrain import fit_world_codec, load_world, world_batches
from margrpo.toylab.pretraining import PretrainConfig, train
from margrpo.world import PRESETS, prompt_vocabulary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, nargs="+", default=[250, 500, 1000, 2000])
    p.add_argument("--head", default="flow", choices=["flow", "ddpm"])
    p.add_argument("--preset", default="grid4", choices=sorted(PRESETS))
    p.add_argument("--data", default=None, help="a pipeline data folder: its world.json and eval.jsonl (not --preset)")
    p.add_argument("--seed", type=int, default=0, help="the policy's initialisation and pre-training stream")
    p.add_argument("--pretrain", default="{}", help="PretrainConfig overrides as JSON")
    p.add_argument("--model", default="{}", help="ToyMARConfig overrides as JSON")
    p.add_argument("--sampling", default='{"ar_steps": 8}', help="SamplingConfig overrides as JSON")
    p.add_argument("--images-per-prompt", type=int, default=4)
    p.add_argument("--n-eval", type=int, default=120)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    p.add_argument("--save", default=None, help="save_pretrained the last policy here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.data:
        world = load_world(Path(args.data) / "world.json")
        records = load_suite(Path(args.data) / "eval.jsonl")
    else:
        world = PRESETS[args.preset]
        records = build_suites(world, 0, 8, 8, args.n_eval)["eval"]
    sampling = SamplingConfig(**json.loads(args.sampling))
    rows = []
    for steps in args.steps:
        torch.manual_seed(args.seed)
        policy = ToyMAR(
            ToyMARConfig(
                head_type=args.head, image_size=world.image_size, vocab=prompt_vocabulary(), **json.loads(args.model)
            )
        )
        kept = fit_world_codec(policy, world)  # the pretrain stage's own fit (None for pixel tokens)
        policy = policy.to(args.device)
        cfg = PretrainConfig(**{"steps": steps, "save_every": 10**9, "seed": args.seed, **json.loads(args.pretrain)})
        with tempfile.TemporaryDirectory() as state:  # resume checkpoints: not wanted here
            t0 = time.perf_counter()
            train(policy, world_batches(world), cfg, state)
            train_s = time.perf_counter() - t0
        report, _ = quality_report(
            policy, records, sampling, args.images_per_prompt, world_cfg=world, precision=cfg.precision
        )
        row = {
            "steps": steps,
            "train_s": round(train_s, 1),
            "device": args.device,
            "params_M": round(count_parameters(policy) / 1e6, 2),
            "codec_variance_kept": kept,
            "single_object": report["single_object_color_and_shape"]["accuracy"],
            "single_object_seen_pairs": report["single_object_color_and_shape"]["seen_pairs"]["accuracy"],
            "single_object_heldout_pairs": report["single_object_color_and_shape"]["heldout_pairs"]["accuracy"],
            "strict": report["overall"]["strict"],
            "shuffled_strict": report["overall"]["shuffled_strict"],
            "per_category": {c: round(v["strict"], 3) for c, v in report["per_category"].items()},
            "pretrain": dataclasses.asdict(cfg),
            "model": json.loads(args.model),
            "sampling": json.loads(args.sampling),
        }
        rows.append(row)
        cats = " ".join(f"{c}={v:.2f}" for c, v in row["per_category"].items())
        print(
            f"steps={steps:5d} train={train_s:7.1f}s single={row['single_object']:.3f} "
            f"(seen pairs {row['single_object_seen_pairs']:.3f}, held-out {row['single_object_heldout_pairs']:.3f}) "
            f"strict={row['strict']:.3f} "
            f"(shuffled {row['shuffled_strict']:.3f}) {cats}",
            flush=True,
        )
    if args.save:
        policy.save_pretrained(args.save)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
