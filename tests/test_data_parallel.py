"""Data parallel GRPO on the gloo backend (torchrun, 2 CPU processes): the same update as one process,
one writer, and a killed run that resumes to the uninterrupted result."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from margrpo.grpo.data_parallel import shard
from margrpo.grpo.streams import group_generators

WORKER = Path(__file__).parent / "dp_worker.py"
SRC = Path(__file__).parents[1] / "src"


def torchrun(nproc: int, mode: str, out: Path, **env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(WORKER), mode, str(out)]
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), **env}
    return subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=300)


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def relative_error(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """||a - b|| / ||b|| over all the tensors as one vector (per tensor, Adam's first step turns the rounding
    noise of exactly-zero gradients, such as attention's key bias, into full +-lr steps: not a difference)."""
    assert len(a) == len(b) and all(x.shape == y.shape for x, y in zip(a, b))
    a, b = torch.cat([x.flatten() for x in a]), torch.cat([y.flatten() for y in b])
    return ((a - b).norm() / b.norm()).item()


def test_shards_are_whole_groups_and_streams_ignore_the_split():
    assert [list(shard(4, r, 2)) for r in range(2)] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        shard(3, 0, 2)
    one = [g.initial_seed() for g in group_generators(0, 5, 1, range(4))]
    two = [g.initial_seed() for r in range(2) for g in group_generators(0, 5, 1, shard(4, r, 2))]
    assert one == two and len(set(one)) == 4
    assert set(one).isdisjoint(g.initial_seed() for g in group_generators(0, 5, 2, range(4)))  # MTE's stream differs


def test_two_processes_take_the_one_process_first_update(tmp_path):
    """Each process rolls out one of the two groups; summed gradients give the 1-process step (1e-5)."""
    ok(torchrun(1, "first-update", tmp_path / "one"))
    ok(torchrun(2, "first-update", tmp_path / "two"))
    one, two = (torch.load(tmp_path / d / "first_update.pt") for d in ("one", "two"))
    for variant in one:
        assert relative_error(one[variant]["params"], _initial()) > 1e-6, f"{variant}: the update changed nothing; the comparison would be empty"
        assert relative_error(two[variant]["grads"], one[variant]["grads"]) < 1e-5, variant
        assert relative_error(two[variant]["params"], one[variant]["params"]) < 1e-5, variant
        for key in ("reward_mean", "reward_std", "adv_std", "policy_loss", "kl", "grad_norm_ar", "grad_var_ar"):
            assert two[variant]["row"][key] == pytest.approx(one[variant]["row"][key], rel=1e-4, abs=1e-7), (variant, key)
    assert "mte_frac" in two["mte-sim"]["row"]


def _initial() -> list[torch.Tensor]:
    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import tiny_policy

    return [p.detach().clone() for p in tiny_policy("flow", seed=1).parameters()]


def test_only_rank_zero_writes_and_a_killed_run_resumes_to_the_same_result(tmp_path):
    ok(torchrun(2, "train", tmp_path / "straight"))
    writes = [json.loads((tmp_path / "straight" / f"writes-rank{r}.json").read_text()) for r in range(2)]
    assert any("trainer.pt" in w for w in writes[0]) and any("metrics.csv" in w for w in writes[0])
    assert writes[1] == [], writes[1]
    rows = (tmp_path / "straight" / "run" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 5  # header + 4 steps, written once

    killed = torchrun(2, "train", tmp_path / "killed", KILL_AT_STEP="3")
    assert killed.returncode != 0 and not (tmp_path / "killed" / "params-rank0.pt").exists()
    assert (tmp_path / "killed" / "run" / "state" / "trainer.pt").exists()  # the step-2 checkpoint
    resumed = torchrun(2, "train", tmp_path / "killed")
    ok(resumed)
    assert "resumed from" in resumed.stderr
    for r in range(2):
        a, b = (torch.load(tmp_path / d / f"params-rank{r}.pt") for d in ("straight", "killed"))
        assert relative_error(b, a) < 1e-6
    straight, again = ((tmp_path / d / "run" / "metrics.csv").read_text().splitlines() for d in ("straight", "killed"))
    assert len(again) == 5 and [r.split(",")[:3] for r in again] == [r.split(",")[:3] for r in straight]
