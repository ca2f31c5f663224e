"""`margrpo <stage> ...`: one subcommand per pipeline stage, and `margrpo plan` (the memory plan).

Each stage lives in `margrpo.stages.<module>` (the plan in `margrpo.plan.command`) and exposes
`add_arguments(parser)` and `run(args)`; this file only routes. Stages never import Snakemake, so every
stage also runs by hand (`margrpo train --help`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

# subcommand -> (module under margrpo.stages, or a full module path, one-line help)
STAGES: dict[str, tuple[str, str]] = {
    "make-suites": ("make_suites", "write the ShapesWorld prompt suites (train / val / eval JSONL)"),
    "train-toyclip": ("train_toyclip", "train the learned toy alignment reward (the CLIP analogue)"),
    "train-toypref": ("train_toypref", "fine-tune toyclip into the toy preference reward (the HPS analogue)"),
    "pretrain": ("pretrain", "train a toy MAR base policy on ShapesWorld from scratch"),
    "place-weights": ("toy_weights", "copy a shipped toy stage (toy_weights: shipped) into results/, checksums first"),
    "pack-weights": ("toy_weights", "pack a config's trained toy stages into the release (make toy-weights)"),
    "refresh-release": ("toy_weights", "keep the release current across a change of its code that moves no number"),
    "check-weights": ("check_weights", "check a local real-scale weights folder and write a pointer to it"),
    "weights": ("weights", "list the released models a config needs: found, or the `hf download` command"),
    "warmup": ("warmup", "fine-tune only the diffusion head (Harmon warm-up, design.md §3.11)"),
    "train": ("train", "GRPO training: grpo / fix / mte / sim variants"),
    "pretrain-mask": ("pretrain_mask", "train the discrete toy-mask base policy (MaskGIT-style) on ShapesWorld"),
    "distill-marval": ("distill_marval", "distil a toy-nova teacher into a one-step policy (MARVAL)"),
    "train-related": ("train_related", "a related method's run: grpo-mask, maskgrpo or marval-rl (issue #19)"),
    "select": ("select_checkpoint", "pick the checkpoint to report (best-by-validation or fixed step)"),
    "sample": ("sample", "sample a prompt suite in the T2I-CompBench layout"),
    "eval-compbench": ("eval_compbench", "CompBench-style scores of a samples directory"),
    "eval-preference": ("eval_preference", "preference-model scores of a samples directory"),
    "uncertainty": ("uncertainty", "per-token MTE uncertainty maps of a policy (data for Fig. 4)"),
    "exact-gradient": ("estimators", "the exact (pathwise) gradient of the expected reward at a base, once per base"),
    "gradient-estimator": ("estimators", "one estimator's batch gradients at the base, against the exact gradient"),
    "report": ("report", "tables (CSV / Markdown / LaTeX) and figures from result files"),
    "plan": ("margrpo.plan.command", "per-GPU memory plan of a GRPO step of the real-scale policies (fake tensors)"),
}


def _module_path(module: str) -> str:
    return module if module.startswith("margrpo.") else f"margrpo.stages.{module}"


def build_parser(stage: str | None = None) -> argparse.ArgumentParser:
    """The CLI parser; with `stage` given, only that stage's module is imported (jobs start fast)."""
    parser = argparse.ArgumentParser(
        prog="margrpo",
        description=(
            "MAR-GRPO pipeline stages. Normally driven by `snakemake --cores all`; each stage also runs by hand."
        ),
    )
    sub = parser.add_subparsers(dest="stage", metavar="<stage>", required=True)
    for name, (module, help_text) in STAGES.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == stage:
            importlib.import_module(_module_path(module)).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one stage. A user error (a bad setting or input file, whose message names it) exits with
    that message on one line and no traceback; anything else is a bug and keeps its traceback."""
    from margrpo.infra.files import InputError
    from margrpo.infra.kernels import apply_caps

    os.environ["HF_HUB_OFFLINE"] = "1"  # forced: never reach for a hub at run time
    try:
        apply_caps()  # before any stage imports torch or numpy: the same kernels on every x86 CPU (infra/kernels.py)
    except ValueError as err:
        raise SystemExit(f"margrpo: error: {err}") from None
    argv = sys.argv[1:] if argv is None else list(argv)
    stage = argv[0] if argv and argv[0] in STAGES else None
    args = build_parser(stage).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )  # stages report through logging
    try:
        importlib.import_module(_module_path(args._module)).run(args)
    except (InputError, FileNotFoundError) as err:
        raise SystemExit(f"margrpo {args.stage}: error: {err}") from None
    from margrpo.infra.process_group import leave_process_group

    leave_process_group()  # a stage that joined a data-parallel job leaves it (a no-op after `margrpo train`'s own)
    return 0


if __name__ == "__main__":
    sys.exit(main())
