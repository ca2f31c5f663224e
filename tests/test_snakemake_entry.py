"""Issue 69: every rule runs the project's own `margrpo`, however Snakemake was started (workflow/rules/common.smk):
the venv's snakemake called by its path from a shell without the venv, or an interpreter lacking the command."""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import test_workflow
from test_workflow import REPO, SNAKEMAKE

VENV_BIN = Path(sys.executable).parent
smoke_run = test_workflow.smoke_run  # the fixture: a finished smoke DAG, this module's own copy of it


def env_without_venv(tmp_path: Path) -> dict[str, str]:
    """This environment as a shell that never activated the venv: its bin off PATH, no VIRTUAL_ENV. First on PATH,
    a `margrpo` and a `python` that fail: a rule that passes ran the ones beside Snakemake's interpreter."""
    decoys = tmp_path / "decoys"
    decoys.mkdir()
    for name in ("margrpo", "python"):
        (decoys / name).write_text(f"#!/bin/sh\necho 'the decoy {name} ran' >&2\nexit 3\n")
        (decoys / name).chmod(0o755)
    path = [p for p in os.environ["PATH"].split(os.pathsep) if p and Path(p).resolve() != VENV_BIN.resolve()]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    return env | {"PATH": os.pathsep.join([str(decoys), *path]), "HF_HUB_OFFLINE": "1"}


def snakemake_cmd(workdir: Path, *args: str) -> list[str]:
    return [
        *args,
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(REPO / "config/smoke.yaml"),
        "--cores",
        "1",
    ]


@pytest.mark.slow
def test_the_venvs_snakemake_by_its_path_regenerates_a_figure_from_a_shell_without_the_venv(smoke_run, tmp_path):
    figure = smoke_run / "results/smoke/report/fig2_dynamics.png"
    figure.unlink()
    env = env_without_venv(tmp_path)
    assert shutil.which("snakemake", path=env["PATH"]) is None
    out = subprocess.run(snakemake_cmd(smoke_run, SNAKEMAKE), env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    assert figure.stat().st_size > 1000
    assert "decoy" not in (smoke_run / "logs/smoke/report/fig2_dynamics.log").read_text()


def test_an_interpreter_without_the_margrpo_command_stops_the_workflow_naming_it(tmp_path):
    """A venv whose packages hold margrpo but whose bin lacks its console script (the venv's site-packages linked
    into a bare one): Snakemake stops before any job, naming the command and the interpreter."""
    bare = tmp_path / "bare"
    (bare / "bin").mkdir(parents=True)
    shutil.copy(VENV_BIN.parent / "pyvenv.cfg", bare / "pyvenv.cfg")
    (bare / "bin/python").symlink_to(os.path.realpath(sys.executable))
    packages = Path(sysconfig.get_path("purelib"))
    (bare / packages.relative_to(sys.prefix)).parent.mkdir(parents=True)
    (bare / packages.relative_to(sys.prefix)).symlink_to(packages)
    (tmp_path / "work").mkdir()
    cmd = snakemake_cmd(tmp_path / "work", str(bare / "bin/python"), "-m", "snakemake", "-n")
    out = subprocess.run(cmd, env=env_without_venv(tmp_path), capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and f"`margrpo` is not in {bare / 'bin'}" in text, text[-3000:]
