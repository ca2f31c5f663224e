"""The real Snakefile end to end on the smoke config: every table and figure exists and is finite."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def snakemake(workdir, *args):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", HF_HUB_OFFLINE="1")
    cmd = [SNAKEMAKE, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(REPO / "config/smoke.yaml"), "--cores", "2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoke")
    out = snakemake(workdir)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-6000:]
    return workdir


@pytest.mark.slow
def test_smoke_dag_writes_every_table_and_figure(smoke_run):
    report = smoke_run / "results/report"
    for table in ("table1", "table2"):
        for ext in ("csv", "md", "tex"):
            assert (report / f"{table}.{ext}").stat().st_size > 0
        df = pd.read_csv(report / f"{table}.csv")
        means = df[[c for c in df.columns if c.endswith("/mean")]]
        assert len(means.columns) and means.notna().all().all()
        assert all(math.isfinite(v) for v in means.to_numpy().ravel())
    for fig in ("fig2_dynamics", "fig4_uncertainty", "fig6_samples", "fig7a_samples", "fig7b_reward_curves", "fig7c_final_metric"):
        for ext in ("png", "pdf"):
            assert (report / f"{fig}.{ext}").stat().st_size > 1000


@pytest.mark.slow
def test_second_run_has_nothing_to_do_and_a_deleted_figure_reruns_alone(smoke_run):
    out = snakemake(smoke_run, "-n")
    assert out.returncode == 0 and "Nothing to be done" in out.stdout + out.stderr, out.stdout[-2000:]
    (smoke_run / "results/report/fig2_dynamics.png").unlink()
    out = snakemake(smoke_run, "-n")
    text = out.stdout + out.stderr
    assert "fig2_dynamics" in text and "train " not in text and "pretrain" not in text, text[-3000:]
