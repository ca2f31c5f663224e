"""Dry-runs of the repository's Snakefile, shared by the workflow tests: the stages each config's DAG must hold, and
the job counts of a dry-run in a scratch directory (so results a `make run` left in the checkout change nothing)."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

# design.md §3-4: every stage of the experiment must be in the DAG.
TOY_STAGES = {
    "make_suites",
    "train_toyclip",
    "pretrain",
    "warmup",
    "train",  # the ladder and the Fig. 7 grid (test_ablation_points_are_train_jobs_under_ablation)
    "select_checkpoint",
    "sample",
    "eval_compbench",
    "eval_preference",
    "uncertainty_maps",
    "table1",
    "table2",
    "fig2_dynamics",
    "fig4_uncertainty",
    "fig6_samples",
    "fig7a_samples",
    "fig7b_reward_curves",
    "fig7c_final_metric",
}
REAL_STAGES = (TOY_STAGES - {"train_toyclip", "pretrain", "warmup"}) | {"check_weights"}
# the configs whose toy stages the package's release ships (toy_weights: shipped): placed, not trained
SHIPPED_STAGES = (TOY_STAGES - {"train_toyclip", "pretrain"}) | {"place_toyclip", "place_toypref", "place_pretrained"}


def dry_run(workdir, *args):
    """Job counts of a dry-run of the repository's Snakefile in `workdir` (a scratch directory)."""
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--cores", "1", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    table = text.split("Job stats:", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}
