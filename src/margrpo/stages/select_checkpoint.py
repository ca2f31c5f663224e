"""`margrpo select`: write the checkpoint a run reports (design.md §3.12).

    margrpo select --summary results/toy/train/.../seed0/summary.json --step best \\
        --out results/toy/select/.../selection.json

``--step best`` (baselines, marked * in the tables) takes the best validation reward, ties to the
earliest step; ``--step <int>`` (the full method) takes the step fixed in the config in advance.
"""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from margrpo.infra.files import InputError, atomic_write_json
from margrpo.reporting.results import read_summary
from margrpo.reporting.selection import parse_step, select_checkpoint

log = logging.getLogger(__name__)


def _step(text: str) -> str | int:
    try:
        return parse_step(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--summary", required=True, type=Path, help="summary.json written by `margrpo train`")
    parser.add_argument(
        "--step",
        required=True,
        type=_step,
        help=(
            "'best' = best validation reward (baselines, *); 'last' = the last checkpoint; "
            "an integer = that checkpoint step (fixed in advance)"
        ),
    )
    parser.add_argument("--out", required=True, type=Path, help="selection.json to write")


def run(args: argparse.Namespace) -> None:
    summary = read_summary(args.summary)  # cross-checked against the run's metrics.csv
    selection = select_checkpoint(summary, args.step)
    if not Path(selection["policy"]).is_dir():  # the next stage would blame its own input, not this summary
        raise InputError(
            f"{args.summary}: the selected checkpoint (step {selection['step']}) folder {selection['policy']} "
            f"does not exist (relative to {Path.cwd()}); rerun the training run or restore its state/"
        )
    atomic_write_json(args.out, selection)
    val = selection["val_reward"]
    log.info(
        "%s: step %d (%s), val_reward %s -> %s",
        args.summary,
        selection["step"],
        selection["rule"],
        f"{val:.4f}" if math.isfinite(val) else "n/a",
        args.out,
    )
