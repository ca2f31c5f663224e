"""A regular (not editable) install works: the wheel carries the config schema and the prompt data.

The wheel is built from this checkout and installed with --no-deps into a fresh venv; the
dependencies come from the test's own environment through a path entry placed after the venv's
site-packages (what --system-site-packages would give), so nothing is downloaded and the
installed `margrpo` is the only one importable. Every command runs outside the repository.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(*cmd, cwd) -> str:
    out = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder of a fresh venv holding the installed wheel, scratch folder outside the repo)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"  # a copy, so the build leaves no build/ behind in the checkout (links become files)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source)
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        tmp / "dist",
        source,
        cwd=tmp,
    )
    wheel = next((tmp / "dist").glob("margrpo-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "margrpo/schemas/config.schema.yaml",
        "margrpo/data/README.md",
        "margrpo/data/t2i-compbench/LICENSE",
        "margrpo/data/t2i-compbench/color_val.txt",
        "margrpo/data/mar-grpo/LICENSE",
        "margrpo/data/mar-grpo/train_prompts.jsonl",
        "margrpo/policy/params/harmon-1.5b.tsv",
    ):
        assert needed in names, f"{needed} missing from {wheel.name}"
    venv = tmp / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel, cwd=tmp)
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp).strip()
    (Path(site) / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin", tmp


def test_installed_wheel_validates_configs_and_runs_a_stage(installed):
    bin_dir, tmp = installed
    where = _run(
        bin_dir / "python",
        "-c",
        "import margrpo, margrpo.experiment.config as c; print(margrpo.__file__); print(c.SCHEMA_PATH)",
        cwd=tmp,
    )
    package, schema = where.split()
    assert package.startswith(str(tmp / "venv")) and Path(schema).is_file(), where  # not the checkout's src/

    check = (
        "import sys; from margrpo.experiment.config import ConfigError, load_config\n"
        "for path in sys.argv[1:]: load_config(path)\n"
        "try: load_config({'grpo': {'stepz': 1}})\n"
        "except ConfigError as e: print(e)"
    )
    configs = [REPO / "config" / name for name in ("smoke.yaml", "paper-nova.yaml", "paper-harmon.yaml")]
    assert "grpo.stepz" in _run(bin_dir / "python", "-c", check, *configs, cwd=tmp)

    assert "make-suites" in _run(bin_dir / "margrpo", "--help", cwd=tmp)
    data = json.loads(
        _run(
            bin_dir / "python",
            "-c",
            "import json, margrpo.prompts.files as p; print(json.dumps([str(p.RL_PROMPTS), str(p.COMPBENCH_DIR)]))",
            cwd=tmp,
        )
    )
    _run(
        bin_dir / "margrpo",
        "make-suites",
        "--out-dir",
        tmp / "suites",
        "--source",
        "files",
        "--train-file",
        data[0],
        "--eval-dir",
        data[1],
        "--categories",
        "color,numeracy",
        "--n-val",
        "8",
        "--n-eval",
        "5",
        cwd=tmp,
    )
    evaluation = (tmp / "suites" / "eval.jsonl").read_text().splitlines()
    assert len(evaluation) == 10 and len((tmp / "suites" / "val.jsonl").read_text().splitlines()) == 8
    _run(
        bin_dir / "margrpo",
        "make-suites",
        "--out-dir",
        tmp / "toy",
        "--n-train",
        "12",
        "--n-val",
        "4",
        "--n-eval",
        "6",
        cwd=tmp,
    )
    assert (tmp / "toy" / "world.json").is_file()
