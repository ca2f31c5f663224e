"""`margrpo train-toypref`: fine-tune toyclip into the toy preference reward (the HPS analogue) and measure it.

    margrpo train-toypref --world results/data/shapesworld-<hash>/world.json --toyclip-dir results/toyclip/<id>/model \
        --config-json '{"steps": 400, "batch_size": 64, "lr": 0.0003, "seed": 0}' \
        --out-dir results/toypref/mine/model --metrics results/toypref/mine/metrics.json --threads 1

Writes the model folder (config.json, model.safetensors, tokenizer/, checksums.json; saved into a temp folder, then
renamed) and a metrics JSON: held-out pair accuracy overall, for alignment and aesthetic pairs apart, and for the
alignment pairs whose loser has the brighter backdrop; training time and loss. spec.json beside the model folder
records the resolved settings.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from margrpo.experiment.config import validate_section
from margrpo.stages._common import json_arg, setup, stage_args, write_spec
from margrpo.stages.train_toyclip import load_world

log = logging.getLogger(__name__)

CONFIG_DEFAULTS = validate_section({}, "toypref", "toypref")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--world", required=True, type=Path, help="world.json written by make-suites (the WorldConfig)"
    )
    parser.add_argument("--toyclip-dir", required=True, type=Path, help="the trained toyclip model it starts from")
    parser.add_argument(
        "--config-json",
        default="{}",
        help=(
            f"JSON object with keys {', '.join(CONFIG_DEFAULTS)} (the config's toypref block); "
            "missing keys take defaults"
        ),
    )
    parser.add_argument("--out-dir", required=True, type=Path, help="model folder to write (replaced atomically)")
    parser.add_argument("--metrics", required=True, type=Path, help="metrics JSON to write")
    parser.add_argument("--eval-n", type=int, default=2000, help="held-out preference pairs (half of each kind)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")


def run(args: argparse.Namespace) -> None:
    from margrpo.infra.files import atomic_write_json
    from margrpo.rewards.toyclip import ToyClip
    from margrpo.toylab.toyclip_training import save_atomic
    from margrpo.toylab.toypref_training import evaluate_pairs, train_toypref

    settings = json_arg(args.config_json, "--config-json", section="toypref")
    if not settings["enabled"]:
        raise SystemExit("toypref is disabled (enabled: false); the pipeline does not need this stage")
    if args.eval_n < 2:
        raise SystemExit(f"--eval-n {args.eval_n}: need >= 2 held-out pairs")
    device = setup(args.threads, args.device)
    world_cfg = load_world(args.world)
    clip = ToyClip.from_pretrained(args.toyclip_dir, device=device)
    write_spec(Path(args.out_dir).parent, {**stage_args(args), "config_json": settings})
    model, info = train_toypref(
        clip,
        world_cfg,
        steps=settings["steps"],
        batch_size=settings["batch_size"],
        lr=settings["lr"],
        aesthetic_width=settings["aesthetic_width"],
        seed=settings["seed"],
        log=log.info,
    )
    accuracy = evaluate_pairs(model, world_cfg, n=args.eval_n, seed=settings["seed"])
    save_atomic(model, args.out_dir)
    atomic_write_json(
        args.metrics,
        {
            "heldout_pair_accuracy": accuracy["overall"]["accuracy"],
            "per_pair_kind": accuracy,
            "train_seconds": info["train_seconds"],
            "train_cpu_seconds": info["train_cpu_seconds"],
            "final_loss": info["losses"][-1]["loss"],
            "alignment_scale": model.alignment_scale.item(),
            "n_parameters": sum(p.numel() for p in model.parameters()),
            "settings": settings,
            "device": str(device),
            "threads": args.threads,
        },
    )
    log.info(
        f"toypref held-out pair accuracy {accuracy['overall']['accuracy']:.4f} "
        f"(alignment {accuracy['alignment']['accuracy']:.3f}, "
        f"aesthetic {accuracy['aesthetic']['accuracy']:.3f}, alignment with the brighter loser "
        f"{accuracy['alignment_loser_brighter']['accuracy']:.3f}); {settings['steps']} steps in "
        f"{info['train_cpu_seconds']:.0f} CPU s -> {args.out_dir}"
    )
