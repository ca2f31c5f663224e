"""`margrpo weights --config config/paper-nova.yaml`: every released model the config needs, where it was looked
for, what was found (files and sizes) and, for a missing one, the `hf download` command that fetches it.

Exits non-zero while anything is missing. The list, the lookup and the commands are `margrpo.infra.weights`'s,
the same code the DAG's `check_weights` and the loaders use; nothing is downloaded.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a workflow config (YAML), e.g. config/paper-nova.yaml")
    p.add_argument("--markdown", action="store_true", help="print docs/real-scale.md's weights table instead and exit")


def run(args) -> None:
    from margrpo.experiment.config import load_config
    from margrpo.infra.weights import check, markdown_table, needs, report

    if args.markdown:
        print(markdown_table())
        return
    # relative paths as the workflow reads them: from the workflow folder (config/'s parent), as load_config does
    folder = Path(args.config).resolve().parent
    root = folder.parent if folder.name == "config" else folder
    findings = [check(need, root) for need in needs(load_config(args.config))]
    print(report(findings), flush=True)
    if any(not f.ok for f in findings):
        raise SystemExit(1)
