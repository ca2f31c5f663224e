"""Issue #37 item 1: every stage runs under the CPU kernel caps (infra/kernels.py), says so in its metadata, and a
run under them repeats to the bit; on an AVX2 machine the caps change nothing."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import train_inputs

from margrpo.infra.kernels import CAPS, SWITCH, apply_caps

TIMING = {"wall_time_s", "step_time_s", "peak_mem_mb"}  # what a rerun may change


def test_apply_caps_sets_what_the_environment_leaves_open_on_x86_only():
    env = {"MKL_CBWR": "COMPATIBLE"}
    added = apply_caps(env, machine="x86_64")
    assert env == {**CAPS, "MKL_CBWR": "COMPATIBLE"} and "MKL_CBWR" not in added  # the caller's choice stands
    for env, machine in (({SWITCH: "native"}, "x86_64"), ({}, "aarch64"), ({}, "arm64")):
        before = dict(env)
        assert apply_caps(env, machine=machine) == {} and env == before
    with pytest.raises(ValueError, match=f"{SWITCH}='fast'"):
        apply_caps({SWITCH: "fast"}, machine="x86_64")


def run_train(tmp_path: Path, name: str, spec: dict, **env) -> Path:
    """`margrpo train` in a fresh interpreter (the caps act before torch loads), with `env` added to a copy of the
    environment from which the caps themselves are removed; returns the run folder."""
    out = tmp_path / name
    clean = {k: v for k, v in os.environ.items() if k not in CAPS and k != SWITCH}
    cmd = [
        sys.executable,
        "-m",
        "margrpo.cli",
        "train",
        "--policy-dir",
        str(tmp_path / "policy"),
        "--suites-dir",
        str(tmp_path / "suites"),
        "--spec-json",
        json.dumps(spec),
        "--out-dir",
        str(out),
        "--threads",
        "1",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**clean, **env}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def results(run: Path) -> tuple[list[dict], dict[str, bytes]]:
    """The run's metrics without timings, and the bytes of every file of its last checkpoint's policy."""
    with open(run / "metrics.csv") as f:
        rows = [{k: v for k, v in row.items() if k not in TIMING} for row in csv.DictReader(f)]
    policy = sorted(run.glob("state/ckpt-*/policy"))[-1]
    return rows, {str(p.relative_to(policy)): p.read_bytes() for p in sorted(policy.rglob("*")) if p.is_file()}


def test_a_train_run_under_the_caps_repeats_to_the_bit_and_records_them(tmp_path):
    spec = {**train_inputs(tmp_path), "steps": 2}
    first, second = run_train(tmp_path, "a", spec), run_train(tmp_path, "b", spec)
    kernels = json.loads((first / "spec.json").read_text())["kernels"]
    assert {k: kernels[k] for k in CAPS} == CAPS and kernels["mode"] == "capped" and kernels["torch_threads"] == 1
    assert kernels["torch_cpu_capability"] in ("AVX2", "DEFAULT")  # never a wider path than the cap
    rows, weights = results(first)
    assert len(rows) == 2 and weights and (rows, weights) == results(second)
    native = run_train(tmp_path, "native", spec, **{SWITCH: "native"})
    capability = json.loads((native / "spec.json").read_text())["kernels"]["torch_cpu_capability"]
    if capability == "AVX2":  # an AVX2 machine: capped is what it runs anyway, to the bit
        assert results(native) == (rows, weights)
