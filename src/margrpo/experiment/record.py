"""results/<name>/settings.json: the settings an experiment's runs were made with (issue 27).

Configs with one `name` share results/<name>/: a second config with other settings would rerun the
first's runs under its own, deleting their checkpoints and relabelling the results. The first run that
executes jobs records the resolved config there (Snakemake's `onstart`); every later invocation under
that name, dry runs included, must resolve to the same settings or is refused, naming the keys that
differ. Keys that only choose which runs and tables exist, or how they are drawn, are not compared.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from margrpo.experiment.config import ConfigError
from margrpo.infra.files import atomic_write_json

RECORD = "settings.json"
# a change here adds runs or redraws tables and figures, and reruns none of the recorded runs
UNCOMPARED = (
    "report",
    "experiments.ladder",
    "experiments.table1",
    "experiments.ablations.enabled",
    "experiments.ablations.seeds",
    "experiments.related.enabled",
    "experiments.related.seeds",
    "experiments.related.methods",
    "experiments.estimators",  # measured at the base: its own jobs, which Snakemake reruns on a change of their params
    "toy_weights",  # where the shared stages come from: their folders (and settings) are the same either way
    "toy_release",
    "slurm",  # what each job asks SLURM for (time, memory): a cut job resumes to the same result
    "grpo.grad_variance",  # a probe: it logs a column and changes no number
)


def experiment_settings(config: dict) -> dict:
    """The resolved config without the UNCOMPARED keys (JSON types: what the record holds)."""
    settings = json.loads(json.dumps(copy.deepcopy(config)))
    for key in UNCOMPARED:
        *parents, last = key.split(".")
        node = settings
        for part in parents:
            node = node.get(part, {})
        node.pop(last, None)
    return settings


def differing_keys(a, b, path: str = "") -> list[str]:
    """Dotted key paths where two JSON values differ (a whole list counts as one value)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d
            for k in sorted(set(a) | set(b), key=str)
            for d in differing_keys(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        ]
    return [] if a == b else [path or "<top level>"]


def check_experiment(config: dict, results: str | Path = "results", source: str = "config") -> None:
    """Refuse a config whose `name` already holds runs made with other settings."""
    path = Path(results) / config["name"] / RECORD
    if not path.exists():
        return
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"{path}: not a readable settings record ({err}); delete it if results/{config['name']}/ is yours"
        ) from None
    diff = differing_keys(recorded, experiment_settings(config))
    if diff:
        shown = ", ".join(diff[:6]) + (f" and {len(diff) - 6} more" if len(diff) > 6 else "")
        raise ConfigError(
            f"{source}: key 'name': {config['name']!r} already holds runs made with other settings "
            f"({path}; differing: {shown}); give this config a name of its own, or delete {path} to rerun "
            "that experiment with these settings"
        )


def record_experiment(config: dict, results: str | Path = "results") -> None:
    """Write the record if there is none (the check has passed: an existing one holds these settings)."""
    path = Path(results) / config["name"] / RECORD
    if not path.exists():
        atomic_write_json(path, experiment_settings(config))
