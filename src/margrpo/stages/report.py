"""`margrpo report <what>`: a paper table or figure from result files (never from models).

    margrpo report table2 --runs-json '{"base": [...], "runs": [...], "variants": [...]}' \
        --results results/toy --out-prefix results/toy/report/table2 --formats png,pdf --confidence 0.95

Tables write ``<prefix>.csv`` (every number: mean / ci / n columns), ``<prefix>.md`` and
``<prefix>.tex``; figures write ``<prefix>.<fmt>`` for each of ``--formats``. The JSON each
Snakemake rule passes is documented on the builder (``margrpo.reporting.tables`` / ``figures`` / ``related``).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

# what -> (kind, module under margrpo.reporting, builder function)
REPORTS: dict[str, tuple[str, str, str]] = {
    "table1": ("table", "tables", "table1"),
    "table2": ("table", "tables", "table2"),
    "val-gain": ("table", "tables", "val_gain"),
    "table3": ("table", "related", "table3"),
    "claims": ("claims", "claims", "claims"),
    "artifacts": ("report", "artifacts", "artifacts"),
    "estimators": ("report", "estimators", "estimators"),
    "checkpoint-gradients": ("report", "checkpoint_gradients", "checkpoint_gradients"),
    "dynamics": ("figure", "figures", "dynamics"),
    "fig-climb": ("figure", "climb", "climb"),
    "uncertainty": ("figure", "figures", "uncertainty"),
    "samples": ("figure", "figures", "samples"),
    "ablation-samples": ("figure", "figures", "ablation_samples"),
    "ablation-curves": ("figure", "figures", "ablation_curves"),
    "ablation-final": ("figure", "figures", "ablation_final"),
    "related-wallclock": ("figure", "related", "related_wallclock"),
}


def _confidence(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"confidence must be in (0, 1), got {value}")
    return value


def _formats(text: str) -> list[str]:
    formats = [f.strip().lstrip(".").lower() for f in text.split(",") if f.strip()]
    if not formats:
        raise argparse.ArgumentTypeError("give at least one format, e.g. png,pdf")
    return formats


def _runs_json(text: str) -> dict:
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"--runs-json is not valid JSON: {err}") from None
    if not isinstance(spec, dict):
        raise argparse.ArgumentTypeError(f"--runs-json must be a JSON object, got {type(spec).__name__}")
    return spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=list(REPORTS), help="which table or figure to render")
    parser.add_argument(
        "--runs-json",
        required=True,
        type=_runs_json,
        help='the runs to read, e.g. {"base": [...], "runs": [...], "variants": [...]}',
    )
    parser.add_argument("--results", required=True, type=Path, help="the results root (holds eval/, select/, ...)")
    parser.add_argument("--out-prefix", required=True, help="output path without extension")
    parser.add_argument("--formats", type=_formats, default=["png", "pdf"], help="figure formats (default png,pdf)")
    parser.add_argument("--confidence", type=_confidence, default=0.95, help="confidence level of the t-intervals")


def run(args: argparse.Namespace) -> None:
    import importlib

    from margrpo.infra.files import atomic_save_figure

    kind, module, builder = REPORTS[args.what]
    build = getattr(importlib.import_module(f"margrpo.reporting.{module}"), builder)
    result = build(args.results, args.runs_json, confidence=args.confidence)
    if kind == "table":
        from margrpo.reporting.tables import write_table

        paths = write_table(result, args.out_prefix)
    elif kind == "claims":
        from margrpo.reporting.claims_markdown import write_claims

        paths = write_claims(result, args.out_prefix)
    elif kind == "report":  # writes its own files
        paths = result.write(args.out_prefix, args.formats)
    else:
        paths = atomic_save_figure(result, args.out_prefix, args.formats)
    for path in paths:
        log.info("wrote %s", path)
