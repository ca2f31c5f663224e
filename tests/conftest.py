import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from margrpo.infra.kernels import apply_caps  # noqa: E402  (imports neither torch nor numpy)

os.environ["HF_HUB_OFFLINE"] = "1"  # forced: no test reaches for a hub
# The test process runs the CPU kernels every `margrpo` stage runs, set before torch loads: a test that compares
# its own numbers with a stage's or a subprocess's then compares like with like. Without it, an in-process
# `margrpo.cli.main` set the caps in os.environ after torch had chosen AVX-512, and the subprocesses started after
# it ran AVX2 kernels (test_resume's killed runs differed in the 7th digit on an AVX-512 EPYC).
apply_caps()
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session", autouse=True)
def _no_wait_for_an_absent_slurm_controller(request, tmp_path_factory):
    """Every `snakemake` call loads the SLURM executor plugin, which (2.8.0) runs `scontrol show config` for its help
    text when `sinfo` is on PATH. Where SLURM is installed but no controller runs (a CI machine after the slurm test
    installed it), each call waits out the plugin's 10 s timeout: 11 of CI's 18 test minutes. Outside a session that
    runs the slurm-marked test, a `scontrol` that fails at once gives the plugin the same answer (none) without the
    wait."""
    if shutil.which("sinfo") is None or any(item.get_closest_marker("slurm") for item in request.session.items):
        yield
        return
    stub = tmp_path_factory.mktemp("no-slurm-controller") / "scontrol"
    stub.write_text("#!/bin/sh\necho 'scontrol: no SLURM controller in this test session' >&2\nexit 1\n")
    stub.chmod(0o755)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ['PATH']}")
        yield


@pytest.fixture(scope="session")
def cluster():
    """The two-node test cluster (scripts/slurm-cluster.sh) for the slurm-marked tests, started once a session."""
    if os.geteuid() != 0 or not shutil.which("ip") or not (shutil.which("apt-get") or shutil.which("slurmctld")):
        pytest.skip("the test cluster needs root, iproute2 and Debian's slurm packages (scripts/slurm-cluster.sh)")
    script = REPO / "scripts/slurm-cluster.sh"
    start = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True, timeout=600)
    if start.returncode != 0:  # the daemons that did start go too: the next session starts from nothing
        subprocess.run(["bash", str(script), "stop"], capture_output=True, timeout=120)
    assert start.returncode == 0, start.stdout[-2000:] + start.stderr[-3000:]
    yield
    subprocess.run(["bash", str(script), "stop"], capture_output=True, timeout=120)


@pytest.fixture(autouse=True)
def _single_thread():
    """Tests are tiny; one thread keeps them deterministic and fair on a 2-core machine."""
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture
def logged(caplog):
    """Call it for what margrpo logged at INFO since the last call (what a stage's log file shows)."""
    import logging

    caplog.set_level(logging.INFO, logger="margrpo")

    def read() -> str:
        text = caplog.text
        caplog.clear()
        return text

    return read


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, dict]:
    """name -> scorer options pointing at tiny local models of the real scorers (tests/builders_real.py)."""
    from builders_real import tiny_scorers

    return tiny_scorers(tmp_path_factory.mktemp("tiny_rewards"))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A synthetic results tree (tests/results_tree.py), written once per test module that asks for it."""
    from results_tree import write_tree

    return write_tree(tmp_path_factory.mktemp("results"))
