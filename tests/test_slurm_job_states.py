"""`executor: margrpo-slurm`'s reading of job states (margrpo.infra.slurm_states), without a cluster: every state
the pinned SLURM plugin would wait on forever, or take for success, ends within the patience; a job SLURM requeues
in time is never failed. On the cluster: tests/test_slurm_states.py."""

from pathlib import Path

import pytest
import yaml

from margrpo.infra.slurm_states import JobStates, state_word

REPO = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def states(patience=60.0):
    clock, warned = Clock(), []
    return JobStates(patience, warned.append, clock), clock, warned


def test_sacct_decorations_are_stripped():
    assert state_word("CANCELLED by 1000") == "CANCELLED"
    assert state_word("RUNNING+") == "RUNNING"
    assert state_word("  ") == "UNKNOWN"


def test_a_cancelled_job_reads_as_the_failure_the_plugin_knows_at_once():
    job_states, _, warned = states()
    assert job_states.settle({"7": "CANCELLED by 0", "8": "COMPLETED", "9": "OUT_OF_MEMORY"}) == {
        "7": "CANCELLED",
        "8": "COMPLETED",
        "9": "OUT_OF_MEMORY",
    }
    assert warned == []


@pytest.mark.parametrize("stuck", ["PREEMPTED", "NODE_FAIL", "UNKNOWN", "REVOKED"])
def test_a_state_that_ends_nothing_waits_the_patience_then_fails_once(stuck):
    job_states, clock, warned = states(patience=60)
    assert job_states.settle({"5": "RUNNING"}) == {"5": "RUNNING"}
    clock.now += 10
    assert job_states.settle({"5": stuck}) == {"5": "PENDING"}  # SLURM may still requeue it
    clock.now += 59
    assert job_states.settle({"5": stuck}) == {"5": "PENDING"}
    clock.now += 1
    assert job_states.settle({"5": stuck}) == {"5": "FAILED"}
    assert job_states.settle({"5": stuck}) == {"5": "FAILED"}
    assert len(warned) == 1 and warned[0].startswith(f"SLURM job 5: {stuck} for 60 s"), warned


def test_a_job_requeued_within_the_patience_is_never_failed():
    job_states, clock, warned = states(patience=60)
    job_states.settle({"5": "PREEMPTED"})
    clock.now += 50
    assert job_states.settle({"5": "PENDING"}) == {"5": "PENDING"}  # requeued
    clock.now += 20
    assert job_states.settle({"5": "RUNNING"}) == {"5": "RUNNING"}
    clock.now += 10
    assert job_states.settle({"5": "NODE_FAIL"}) == {"5": "PENDING"}  # a new stuck state: a new patience
    clock.now += 50
    assert job_states.settle({"5": "NODE_FAIL"}) == {"5": "PENDING"}
    clock.now += 10
    assert job_states.settle({"5": "COMPLETED"}) == {"5": "COMPLETED"}
    assert warned == []


def test_a_job_gone_from_the_listing_is_failed_after_the_patience_unless_it_ended():
    job_states, clock, warned = states(patience=60)
    job_states.settle({"5": "RUNNING", "6": "RUNNING"})
    job_states.settle({"5": "RUNNING", "6": "COMPLETED"})
    clock.now += 30
    assert job_states.settle({}) == {"5": "PENDING"}  # 6 ended: not watched any more
    clock.now += 60
    assert job_states.settle({}) == {"5": "FAILED"}
    assert "gone from the status listing" in warned[0], warned
    assert job_states.settle({}) == {}  # reported once; the plugin has ended it


def test_patience_must_be_positive():
    with pytest.raises(ValueError, match="patience must be > 0"):
        JobStates(0)


def test_the_slurm_profile_runs_the_bounded_executor_of_the_pinned_plugin():
    from importlib.metadata import version

    import snakemake_executor_plugin_margrpo_slurm as plugin

    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    assert profile["executor"] == "margrpo-slurm"
    assert profile["margrpo-slurm-patience"] == plugin.ExecutorSettings().patience == 600
    assert version("snakemake-executor-plugin-slurm") == plugin.PINNED
    pins = (REPO / "constraints.txt").read_text().split()
    assert f"snakemake-executor-plugin-slurm=={plugin.PINNED}" in pins


def test_a_node_address_that_is_a_name_is_resolved_skipping_loopback_else_by_its_route(monkeypatch):
    """NodeAddr equals NodeName where a site leaves it unset; Debian maps a machine's own name to 127.0.1.1."""
    import socket

    from margrpo.infra import slurm

    addrs = {"node7": "node7", "node8": "10.1.2.8", "node9": "fd00::9"}
    monkeypatch.setattr(slurm, "_scontrol", lambda *args: f"NodeName={args[-1]} NodeAddr={addrs[args[-1]]} State=IDLE")
    resolves = {"node7": ["127.0.1.1", "192.168.5.7"]}
    monkeypatch.setattr(
        socket, "getaddrinfo", lambda host, *a: [(2, 1, 6, "", (ip, 0)) for ip in resolves.get(host, [])]
    )
    assert slurm.node_address("node8") == "10.1.2.8"  # an address: as SLURM has it
    assert slurm.node_address("node9") == "fd00::9"  # IPv6 too (the launcher binds either family)
    assert slurm.node_address("node7") == "192.168.5.7"  # the name's routable address, not Debian's 127.0.1.1
    resolves["node7"] = ["127.0.1.1"]
    assert slurm.node_address("node7", peer="127.0.0.1") == "127.0.0.1"  # the route to the peer leaves from here
    with pytest.raises(RuntimeError, match="NodeAddr node7 resolves to \\['127.0.1.1'\\] here"):
        slurm.node_address("node7")


def test_the_site_account_partition_and_qos_reach_every_job_a_dry_run_plans(tmp_path):
    """config slurm.account / partition / qos: on the GPU stages and on the CPU rules alike; the train job's time
    and memory default to a 4-hour partition's."""
    import re
    import subprocess

    from dry_runs import SNAKEMAKE

    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"slurm": {"account": "lab7", "partition": "gpu-4h", "qos": "short"}}))
    cmd = [SNAKEMAKE, "-n", "--cores", "2", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path)]
    configs = [str(REPO / "config/paper-nova.yaml"), str(site)]
    out = subprocess.run([*cmd, "--configfile", *configs], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    blocks = [b for b in out.stdout.split("\n\n") if re.match(r"\s*(\[.*\]\n)?rule (?!all:)", b)]
    jobs = {re.search(r"rule (\w+):", b).group(1): re.search(r"resources: (.*)", b).group(1) for b in blocks}
    assert {"train", "make_suites", "table1"} <= set(jobs), sorted(jobs)
    for rule, resources in jobs.items():
        assert "slurm_account=lab7, slurm_partition=gpu-4h, qos=short" in resources, (rule, resources)
    assert "runtime=240, mem_mb=80000" in jobs["train"], jobs["train"]
