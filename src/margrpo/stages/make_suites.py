"""`margrpo make-suites`: write the ShapesWorld prompt suites and the world they belong to.

Outputs in --out-dir: train.jsonl, val.jsonl, eval.jsonl (prompt, category, spec per line) and
world.json (the WorldConfig; `WorldConfig.from_dict(json.load(...))` gives it back), all atomic.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import logging
from pathlib import Path

from margrpo.infra.files import atomic_write_json
from margrpo.prompts.shapesworld import build_suites
from margrpo.prompts.suites import write_suite
from margrpo.world import PALETTE, PRESETS, heldout_in_spec
from margrpo.world.config import world_from_knobs

log = logging.getLogger(__name__)


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _names(text: str) -> tuple[str, ...]:
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _pair(text: str) -> tuple[int, int]:
    lo, hi = (int(t) for t in text.split(","))
    return lo, hi


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out-dir", required=True, help="folder for train/val/eval.jsonl and world.json")
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the prompt draw (the held-out pairs come from --heldout-seed)"
    )
    parser.add_argument("--n-train", type=int, default=600)
    parser.add_argument("--n-val", type=int, default=48)
    parser.add_argument("--n-eval", type=int, default=210)
    parser.add_argument(
        "--source",
        choices=("shapesworld", "files"),
        default="shapesworld",
        help="files: real prompts (--train-file, --eval-dir); --n-eval then caps prompts per category",
    )
    parser.add_argument("--train-file", help="files source: RL prompts (T2I-R1 JSON Lines or .txt)")
    parser.add_argument(
        "--val-file", help="files source: validation prompts (default: drawn from <category>_train.txt)"
    )
    parser.add_argument("--eval-dir", help="files source: T2I-CompBench folder with <category>_val.txt")
    parser.add_argument(
        "--categories",
        type=_names,
        default=("color", "shape", "texture", "spatial", "numeracy", "complex"),
        help="files source: comma-separated evaluation categories",
    )
    world = parser.add_argument_group("world", "ShapesWorld knobs (WorldConfig fields); unset ones come from --preset")
    world.add_argument("--preset", choices=sorted(PRESETS), default="toy32")
    world.add_argument("--image-size", type=int)
    world.add_argument("--grid", type=int)
    world.add_argument("--snap", type=_bool, help="true / false")
    world.add_argument("--jitter-px", type=int)
    world.add_argument("--size-range", type=_pair, help="min,max object size in px, e.g. 11,12")
    world.add_argument("--min-gap-px", type=int)
    world.add_argument("--max-objects", type=int)
    world.add_argument("--palette", type=_names, help=f"comma-separated colours from {', '.join(PALETTE)}")
    world.add_argument("--palette-size", type=int, help=f"use the first N colours of {', '.join(PALETTE)}")
    world.add_argument("--shapes", type=_names)
    world.add_argument("--textures", type=_names, help="e.g. solid,hollow (add striped at 64 px)")
    world.add_argument("--line-px", type=int)
    world.add_argument("--stripe-period-px", type=int)
    world.add_argument(
        "--backdrop-max",
        type=float,
        help="scenes' backdrops drawn uniformly from 0 (black) to this grey (the aesthetic)",
    )
    world.add_argument("--n-heldout-pairs", type=int)
    world.add_argument("--heldout-seed", type=int)


def world_config(args: argparse.Namespace):
    fields = (f.name for f in dataclasses.fields(PRESETS[args.preset]))
    knobs = {
        name: getattr(args, name)
        for name in (*fields, "palette_size", "backdrop_max")
        if getattr(args, name, None) is not None
    }
    if "palette" in knobs and "palette_size" in knobs:
        raise SystemExit("give --palette or --palette-size, not both")  # the flags' names, not world_from_knobs' keys
    try:
        return world_from_knobs(PRESETS[args.preset], knobs)
    except ValueError as err:
        raise SystemExit(f"make-suites: {err}") from err


def run(args: argparse.Namespace) -> None:
    from margrpo.stages._common import stage_args, write_spec

    write_spec(args.out_dir, stage_args(args))
    if args.source == "files":
        return run_files(args)
    cfg = world_config(args)
    out = Path(args.out_dir)
    suites = build_suites(cfg, args.seed, args.n_train, args.n_val, args.n_eval)
    for split, records in suites.items():
        write_suite(records, out / f"{split}.jsonl")
    atomic_write_json(out / "world.json", cfg.to_dict())
    heldout = cfg.heldout_pairs()
    log.info(f"world: {cfg}")
    log.info(f"held-out (colour, shape) pairs, absent from train and val: {sorted(heldout)}")
    for split, records in suites.items():
        counts = dict(collections.Counter(r.category for r in records))
        unseen = sum(heldout_in_spec(r.spec, heldout) for r in records)
        log.info(f"{split}: {len(records)} prompts {counts}; binding a held-out pair: {unseen}")


def run_files(args: argparse.Namespace) -> None:
    from margrpo.prompts.files import build_file_suites

    if not args.train_file or not args.eval_dir:
        raise SystemExit(
            "make-suites --source files needs --train-file and --eval-dir (prompts.train_file / prompts.eval_dir)"
        )
    try:
        suites = build_file_suites(
            args.train_file, args.eval_dir, list(args.categories), args.n_val, args.seed, args.val_file, args.n_eval
        )
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"make-suites: {err}") from err
    out = Path(args.out_dir)
    for split, records in suites.items():
        write_suite(records, out / f"{split}.jsonl")
    sources = {
        "train_file": args.train_file,
        "val_file": args.val_file,
        "eval_dir": args.eval_dir,
        "categories": list(args.categories),
    }
    atomic_write_json(out / "world.json", {"source": "files", **sources})
    for split, records in suites.items():
        log.info(f"{split}: {len(records)} prompts {dict(collections.Counter(r.category for r in records))}")
