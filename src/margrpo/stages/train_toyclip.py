"""`margrpo train-toyclip`: train the learned toy reward (the HPS analogue) and measure it.

    margrpo train-toyclip --world results/data/shapesworld-<hash>/world.json \
        --config-json '{"steps": 1500, "batch_size": 64, "lr": 0.001, "width": 64, "seed": 0}' \
        --out-dir results/toyclip/mine/model --metrics results/toyclip/mine/metrics.json --threads 1

Writes the model folder (config.json, model.safetensors, tokenizer/; saved into a temp folder,
then renamed) and a metrics JSON: held-out ranking accuracy overall and per swap type (true
caption vs one attribute swapped, on fresh scenes), training time and loss; spec.json beside the
model folder records the resolved settings.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from margrpo.experiment.config import validate_section
from margrpo.stages._common import json_arg, setup, stage_args, write_spec

log = logging.getLogger(__name__)

# --config-json keys and their defaults: the config schema's `toyclip` block (one source of defaults)
CONFIG_DEFAULTS = validate_section({}, "toyclip", "toyclip")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--world", required=True, type=Path, help="world.json written by make-suites (the WorldConfig)"
    )
    parser.add_argument(
        "--config-json",
        default="{}",
        help=(
            f"JSON object with keys {', '.join(CONFIG_DEFAULTS)} (the config's toyclip block); "
            "missing keys take defaults"
        ),
    )
    parser.add_argument("--out-dir", required=True, type=Path, help="model folder to write (replaced atomically)")
    parser.add_argument("--metrics", required=True, type=Path, help="metrics JSON to write")
    parser.add_argument("--eval-n", type=int, default=2000, help="held-out (image, true, swapped) triples")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="bf16 autocast for training")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def load_world(path: Path):
    """The WorldConfig from world.json (`WorldConfig.from_dict`), with a clear error if it is missing."""
    from margrpo.infra.files import read_json
    from margrpo.world import WorldConfig

    if not path.is_file():
        raise FileNotFoundError(f"missing {path} (world.json is written by `margrpo make-suites`)")
    return WorldConfig.from_dict(read_json(path))


def toyclip_settings(text: str) -> dict:
    """--config-json validated against the schema's toyclip block, missing keys from its defaults."""
    return json_arg(text, "--config-json", section="toyclip")


def run(args: argparse.Namespace) -> None:
    from margrpo.infra.files import atomic_write_json
    from margrpo.toylab.toyclip_training import evaluate_ranking, save_atomic, train_toyclip

    settings = toyclip_settings(args.config_json)
    if not settings["enabled"]:
        raise SystemExit("toyclip is disabled (enabled: false); the pipeline does not need this stage")
    device = setup(args.threads, args.device)
    world_cfg = load_world(args.world)
    write_spec(Path(args.out_dir).parent, {**stage_args(args), "config_json": settings})
    model, info = train_toyclip(
        world_cfg,
        steps=settings["steps"],
        batch_size=settings["batch_size"],
        lr=settings["lr"],
        width=settings["width"],
        seed=settings["seed"],
        log=log.info,
        precision=args.precision,
        device=device,
    )
    ranking = evaluate_ranking(model, world_cfg, n=args.eval_n, seed=settings["seed"])
    save_atomic(model, args.out_dir)
    last = info["losses"][-1]
    metrics = {
        "heldout_ranking_accuracy": ranking["overall"],
        "heldout_ranking_macro": ranking["macro"],
        "per_swap_type": ranking["per_type"],
        "n_triples": ranking["n"],
        "mean_margin": ranking["mean_margin"],
        "train_seconds": info["train_seconds"],
        "train_cpu_seconds": info["train_cpu_seconds"],
        "steps": settings["steps"],
        "final_loss": last["loss"],
        "final_hard_loss": last["hard"],
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "settings": settings,
        "precision": args.precision,
        "device": str(device),
        "threads": args.threads,
    }
    atomic_write_json(args.metrics, metrics)
    per_type = ", ".join(f"{k} {v['accuracy']:.3f}" for k, v in ranking["per_type"].items())
    log.info(
        f"toyclip held-out ranking accuracy: {ranking['overall']:.4f} over {ranking['n']} triples ({per_type}); "
        f"trained {settings['steps']} steps in {info['train_seconds']:.0f} s "
        f"({info['train_cpu_seconds']:.0f} CPU s) -> {args.out_dir}"
    )
