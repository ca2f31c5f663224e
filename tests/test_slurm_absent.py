"""Issue 81: on a machine without SLURM (a new user's, before `make test-slurm` installs it) every SLURM command we
run fails with a one-line message or takes its documented fallback, never a traceback. Each test runs with a PATH
that holds no SLURM binary, whatever this machine has installed."""

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from margrpo.infra import slurm

REPO = Path(__file__).resolve().parents[1]
SLURM_COMMANDS = ("scontrol", "sacct", "sacctmgr", "squeue", "scancel", "sbatch", "srun", "sinfo")


def path_without_slurm(shadows: Path) -> str:
    """PATH with each folder that holds a SLURM command replaced by links to its other programs (as
    scripts/without-slurm.sh does for CI's `make test`)."""
    folders = []
    for i, folder in enumerate(os.environ["PATH"].split(os.pathsep)):
        where = Path(folder)
        if not any((where / command).exists() for command in SLURM_COMMANDS):
            folders.append(folder)
            continue
        shadow = shadows / str(i)
        shadow.mkdir(parents=True)
        for program in where.iterdir():
            if program.name not in SLURM_COMMANDS:
                (shadow / program.name).symlink_to(program)
        folders.append(str(shadow))
    return os.pathsep.join(folders)


@pytest.fixture
def no_slurm(tmp_path, monkeypatch) -> dict[str, str]:
    """No SLURM command on PATH, whatever this machine has installed; the environment for a subprocess."""
    path = path_without_slurm(tmp_path / "shadows")
    monkeypatch.setenv("PATH", path)
    assert not [c for c in SLURM_COMMANDS if shutil.which(c)]
    return {**os.environ, "PATH": path, "PYTHONPATH": str(REPO / "src")}


def test_an_absent_scontrol_is_named_in_one_line_and_every_reader_falls_back(no_slurm, tmp_path, caplog, monkeypatch):
    with pytest.raises(slurm.SlurmCommandMissing) as missing:
        slurm.job_record("5")
    assert str(missing.value) == slurm.missing_command_message("scontrol") and "\n" not in str(missing.value)
    assert isinstance(missing.value, OSError)  # what the callers that tolerate a failed SLURM call catch
    caplog.set_level(logging.WARNING, logger="margrpo")
    assert slurm.job_end_time("5") is None and "scontrol: not on PATH" in caplog.text
    assert slurm.ending_state("5") == "" and not slurm.given_up("5")
    assert slurm.after_stop(20, tmp_path, 3, job_id="5") == "ended"  # ends resumable: a retry resumes it
    assert not slurm.requeue(20, "5")
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert "SLURM job 5, restart ?," in slurm.segment_header()


def test_the_executors_mark_and_scancel_without_slurm_warn_and_go_on(no_slurm, caplog):
    import snakemake_executor_plugin_margrpo_slurm as plugin

    caplog.set_level(logging.WARNING, logger="margrpo")
    slurm.mark_given_up(["5", "6"])  # documented: a failed mark leaves a plain scancel
    assert "not marked as given up" in caplog.text and "scontrol: not on PATH" in caplog.text

    class Logger:
        said: list[str] = []

        def warning(self, text: str) -> None:
            self.said.append(text)

    class Executor:
        _submitted_job_clusters: set = set()
        logger = Logger()

    plugin.Executor.cancel_given_up(Executor(), ["5", "6"])  # the plugin's own scancel: absent too
    assert Logger.said and "sent again at the next status query" in Logger.said[-1]
    assert set(plugin.missing_slurm_commands()) == set(plugin.SUBMIT_HOST_COMMANDS)


def test_snakemake_with_the_slurm_executor_names_the_missing_commands(no_slurm, tmp_path):
    (tmp_path / "Snakefile").write_text('rule a:\n    output: "a.txt"\n    shell: "touch {output}"\n')
    snakemake = [str(Path(sys.executable).parent / "snakemake"), "--executor", "margrpo-slurm", "--jobs", "1"]
    run = subprocess.run(snakemake, cwd=tmp_path, env=no_slurm, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "executor margrpo-slurm: sbatch, sacct, squeue, scancel, scontrol not on PATH" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr + run.stdout


@pytest.mark.parametrize(
    "code, says",
    [
        (
            "from margrpo.infra.launch import main; main(['--nodes', '2', '1', 'true'])",
            "margrpo.infra.launch: SLURM job 5's nodes cannot be read: scontrol: not on PATH",
        ),
        (
            "from margrpo.infra.launch import _run_forwarding_stops as run; run(['srun', 'true'])",
            "margrpo.infra.launch: srun: not on PATH",
        ),
    ],
)
def test_the_multi_node_launcher_without_slurm_exits_with_one_line(no_slurm, code, says):
    env = {**no_slurm, "SLURM_JOB_ID": "5"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(says), run.stderr


def test_ci_runs_make_test_with_every_slurm_command_hidden(tmp_path):
    """.ci/run runs `make test` through scripts/without-slurm.sh: a PATH folder holding a SLURM command (Debian's
    /usr/bin once `make test-slurm` installed SLURM) is replaced by links to its other programs."""
    assert "scripts/without-slurm.sh make test " in (REPO / ".ci/run").read_text()
    installed = tmp_path / "usr-bin"
    installed.mkdir()
    for name in ("scontrol", "srun", "sbatch", "tool"):
        (installed / name).write_text(f"#!/bin/sh\necho {name}\n")
        (installed / name).chmod(0o755)
    path = os.pathsep.join([str(installed), os.environ["PATH"]])
    probe = "command -v scontrol || command -v srun || command -v sbatch || tool"
    run = subprocess.run(
        ["bash", str(REPO / "scripts/without-slurm.sh"), "sh", "-c", probe],
        env={**os.environ, "PATH": path, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0].startswith("without-slurm: `command -v scontrol` finds nothing; hidden: ")
    assert run.stdout.splitlines()[1:] == ["tool"]  # no SLURM command found, the folder's other programs kept
    assert [p.name for p in tmp_path.iterdir()] == ["usr-bin"]  # its links removed once the command is done
