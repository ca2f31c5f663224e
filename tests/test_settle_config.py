"""config/settle.yaml (issue 53): the settling design as its own config, the default run's ladder at 48 images a step
on seeds 0-4 and the second seed set 5-9. It passes the config checks and dry-runs to the full DAG; it is not run."""

import subprocess
import sys

from dry_runs import REPO, SHIPPED_STAGES, dry_run

from margrpo.experiment.config import load_config, train_spec

SETTLE = REPO / "config" / "settle.yaml"


def test_the_settle_config_passes_the_config_checks():
    """`make run`'s check of the config files (margrpo's own reader), then the full load (schema and cross-field
    checks): the 48-image ladder on both seed sets, under its own name, the rest as the default run."""
    check = subprocess.run(
        [sys.executable, "-m", "margrpo.experiment.config_checks", "--configfile", str(SETTLE)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    settle, default = load_config(SETTLE), load_config(REPO / "config" / "config.yaml")
    names = {load_config(p)["name"] for p in REPO.glob("config/*.yaml") if p != SETTLE}
    assert settle["name"] not in names  # its results do not collide with another config's
    spec = train_spec(settle, "toy-nova", "toypref", "fix")["grpo"]
    assert spec["batch_prompts"] * spec["group_size"] == 48
    ladder = settle["experiments"]["ladder"]
    assert ladder["seeds"] == [0, 1, 2, 3, 4] and ladder["replicate_seeds"] == [5, 6, 7, 8, 9]
    assert ladder["replicate_variants"] is None  # the second set trains every variant: every claim gets `both`
    assert {k: v for k, v in ladder.items() if "replicate" not in k} == {
        k: v for k, v in default["experiments"]["ladder"].items() if "replicate" not in k
    }
    same = {k: v for k, v in settle["grpo"].items() if k != "group_size"}
    assert same == {k: v for k, v in default["grpo"].items() if k != "group_size"}
    assert settle["policies"] == default["policies"] and settle["rewards"] == default["rewards"]


def test_the_settle_config_dry_runs_to_the_full_dag(tmp_path):
    """`snakemake -n --configfile config/settle.yaml`: every stage, and the second seed set's 30 ladder runs on top
    of the default run's train jobs. (The shared toy stages are placed from the release or, where the working tree's
    code of a stage differs from the release's, trained: either way, as for the default config.)"""
    settle = dry_run(tmp_path / "settle", "--configfile", str(SETTLE))
    default = dry_run(tmp_path / "default")
    stages = {s for s in SHIPPED_STAGES if not s.startswith("place_")}
    assert stages <= set(settle), f"missing stages: {stages - set(settle)}"
    assert settle["all"] == 1
    cfg = load_config(SETTLE)["experiments"]
    # the ladder's variants on seeds 5-9, and the climbing ladder's (its seeds 0-9: the claims split them the same way)
    assert settle["train"] == default["train"] + len(cfg["ladder"]["variants"]) * 5 + len(cfg["climb"]["variants"]) * 5
