"""`executor: margrpo-slurm`'s reading of job states (margrpo.infra.slurm_states), without a cluster: every state
the pinned SLURM plugin would wait on forever, or take for success, ends within the patience (a paused one is named
first); a job given up on is cancelled, and reported failed only once slurmctld shows it ended; a job SLURM requeues,
or a person lets go on, in time is never failed. Fakes of sacct's listing and squeue's view, as SLURM 22.05 writes
them on the test cluster. On the cluster: tests/test_slurm_states.py."""

from pathlib import Path
from subprocess import CompletedProcess

import pytest
import yaml

from margrpo.infra.slurm_states import JobStates, controller_view, state_word

REPO = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Controller:
    """slurmctld's view of the jobs as `squeue --states=all -o %i|%T|%r` gives it, and the `scancel`s it got: a
    pending or held job ends at once, a running or suspended one is COMPLETING until `finish`."""

    def __init__(self, **jobs: tuple[str, str]):
        self.jobs = {job.lstrip("j"): seen for job, seen in jobs.items()}
        self.answers, self.cancels = True, []

    def look(self, jobs):
        return {j: self.jobs[j] for j in jobs if j in self.jobs} if self.answers else None

    def cancel(self, jobs):
        self.cancels.append(sorted(jobs))
        for job in jobs:
            state = self.jobs.get(job, ("", ""))[0]
            if state in ("RUNNING", "SUSPENDED", "STOPPED"):
                self.jobs[job] = ("COMPLETING", "None")
            elif state in ("PENDING", "REQUEUE_HOLD", "SPECIAL_EXIT"):
                self.jobs[job] = ("CANCELLED", self.jobs[job][1])

    def finish(self, job):
        self.jobs[job] = ("CANCELLED", "None")


def states(patience=60.0, held_patience=None, controller=None):
    clock, warned, controller = Clock(), [], controller or Controller()
    job_states = JobStates(
        patience, held_patience, look=controller.look, cancel=controller.cancel, warn=warned.append, clock=clock
    )
    return job_states, clock, warned, controller


def test_sacct_decorations_are_stripped():
    assert state_word("CANCELLED by 1000") == "CANCELLED"
    assert state_word("RUNNING+") == "RUNNING"
    assert state_word("  ") == "UNKNOWN"


def test_a_cancelled_job_reads_as_the_failure_the_plugin_knows_at_once():
    job_states, _, warned, controller = states()
    assert job_states.settle({"7": "CANCELLED by 0", "8": "COMPLETED", "9": "OUT_OF_MEMORY"}) == {
        "7": "CANCELLED",
        "8": "COMPLETED",
        "9": "OUT_OF_MEMORY",
    }
    assert warned == [] and controller.cancels == []


@pytest.mark.parametrize("stuck", ["PREEMPTED", "NODE_FAIL", "UNKNOWN", "REVOKED"])
def test_a_state_that_ends_nothing_waits_the_patience_then_is_cancelled_and_fails_once(stuck):
    job_states, clock, warned, controller = states(patience=60, controller=Controller(j5=(stuck, "None")))
    assert job_states.settle({"5": "RUNNING"}) == {"5": "RUNNING"}
    clock.now += 10
    assert job_states.settle({"5": stuck}) == {"5": "PENDING"}  # SLURM may still requeue it
    clock.now += 59
    assert job_states.settle({"5": stuck}) == {"5": "PENDING"}
    assert controller.cancels == []
    clock.now += 1
    assert job_states.settle({"5": stuck}) == {"5": "FAILED"}  # cancelled; slurmctld shows it ended
    assert controller.cancels == [["5"]]
    assert job_states.settle({"5": stuck}) == {"5": "FAILED"}
    assert len(warned) == 1 and warned[0].startswith(f"SLURM job 5: {stuck} for 60 s"), warned
    assert f"cancelled, and ended ({stuck})" in warned[0], warned


def test_a_job_requeued_within_the_patience_is_never_failed():
    job_states, clock, warned, controller = states(patience=60, controller=Controller(j5=("PENDING", "BeginTime")))
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
    assert warned == [] and controller.cancels == []


def test_a_job_pending_for_resources_or_priority_is_waited_for_without_bound():
    job_states, clock, warned, controller = states(patience=60, controller=Controller(j5=("PENDING", "Resources")))
    for _ in range(10):
        assert job_states.settle({"5": "PENDING"}) == {"5": "PENDING"}
        clock.now += 3600
    assert warned == [] and controller.cancels == []


def test_a_running_job_gone_from_the_listing_is_cancelled_and_failed_only_once_slurmctld_shows_it_ended():
    """The job still runs where the status command no longer lists it: its retry must not start beside it."""
    controller = Controller(j5=("RUNNING", "None"), j6=("COMPLETED", "None"))
    job_states, clock, warned, _ = states(patience=60, controller=controller)
    job_states.settle({"5": "RUNNING", "6": "RUNNING"})
    job_states.settle({"5": "RUNNING", "6": "COMPLETED"})
    clock.now += 30
    assert job_states.settle({}) == {"5": "PENDING"}  # 6 ended: not watched any more
    clock.now += 60
    assert job_states.settle({}) == {"5": "PENDING"}  # given up: scancel sent, the job still COMPLETING
    assert controller.cancels == [["5"]] and controller.jobs["5"] == ("COMPLETING", "None")
    clock.now += 20
    assert job_states.settle({"5": "CANCELLED by 0"}) == {"5": "PENDING"}  # sacct runs ahead of slurmctld
    assert controller.cancels == [["5"]]  # COMPLETING: no second scancel
    controller.finish("5")
    clock.now += 20
    assert job_states.settle({}) == {"5": "FAILED"}
    assert len(warned) == 1 and warned[0].startswith("SLURM job 5: gone from the status listing for 60 s"), warned
    assert "cancelled, and ended (CANCELLED); reported to Snakemake as FAILED" in warned[0], warned
    assert job_states.settle({}) == {}  # reported once; the plugin has ended it


def test_a_given_up_job_waits_for_an_answer_from_slurmctld_and_a_scancel_that_did_not_take_is_sent_again():
    controller = Controller(j5=("RUNNING", "None"))
    job_states, clock, warned, _ = states(patience=60, controller=controller)
    job_states.settle({"5": "RUNNING"})
    job_states.settle({"5": "UNKNOWN"})
    clock.now += 60
    controller.answers = False
    assert job_states.settle({"5": "UNKNOWN"}) == {"5": "PENDING"}
    assert job_states.settle({"5": "UNKNOWN"}) == {"5": "PENDING"}
    controller.answers, controller.jobs["5"] = True, ("RUNNING", "None")  # the first scancel was lost
    assert job_states.settle({"5": "UNKNOWN"}) == {"5": "PENDING"}
    assert controller.cancels == [["5"], ["5"]] and warned == []
    del controller.jobs["5"]  # slurmctld forgot it (MinJobAge after its end)
    assert job_states.settle({"5": "UNKNOWN"}) == {"5": "FAILED"}
    assert "ended (forgotten by slurmctld)" in warned[0], warned


PAUSES = {  # what sacct lists, what squeue shows (both as SLURM 22.05 wrote them on the test cluster), the remedy
    "held by an admin": ("PENDING", ("PENDING", "JobHeldAdmin"), "scontrol release 5"),
    "held by its user": ("PENDING", ("PENDING", "JobHeldUser"), "scontrol release 5"),
    "requeue hold": ("PENDING", ("PENDING", "job requeued in held state"), "scontrol release 5"),
    "REQUEUE_HOLD": ("REQUEUE_HOLD", ("REQUEUE_HOLD", "job requeued in held state"), "scontrol release 5"),
    "SPECIAL_EXIT": ("PENDING", ("SPECIAL_EXIT", "job requeued in held state"), "scontrol release 5"),
    "held by SLURM": ("PENDING", ("PENDING", "launch failed requeued held"), "scontrol release 5"),
    "SUSPENDED": ("SUSPENDED", ("SUSPENDED", "None"), "scontrol resume 5"),
    "STOPPED": ("STOPPED", ("STOPPED", "None"), "scancel --signal=CONT 5"),
}


@pytest.mark.parametrize("pause", sorted(PAUSES))
def test_a_paused_job_is_named_after_the_patience_and_given_up_after_the_held_patience(pause):
    listed, seen, remedy = PAUSES[pause]
    controller = Controller(j5=seen)
    job_states, clock, warned, _ = states(patience=60, held_patience=300, controller=controller)
    assert job_states.settle({"5": "RUNNING"}) == {"5": "RUNNING"}
    assert job_states.settle({"5": listed}) == {"5": "PENDING"}
    clock.now += 59
    assert job_states.settle({"5": listed}) == {"5": "PENDING"} and warned == []
    clock.now += 1
    assert job_states.settle({"5": listed}) == {"5": "PENDING"}
    what = seen[0] + ("" if seen[1] == "None" else f" ({seen[1]})")
    assert len(warned) == 1 and warned[0].startswith(f"SLURM job 5 is {what} for 60 s, waiting for a person"), warned
    assert f"`{remedy}` lets it go on, `scancel 5` fails it" in warned[0] and "after 300 s" in warned[0], warned
    clock.now += 239
    assert job_states.settle({"5": listed}) == {"5": "PENDING"} and controller.cancels == [] and len(warned) == 1
    clock.now += 1
    settled = job_states.settle({"5": listed})
    assert controller.cancels == [["5"]]
    if seen[0] in ("RUNNING", "SUSPENDED", "STOPPED"):  # its processes end after the scancel
        assert settled == {"5": "PENDING"}
        controller.finish("5")
        settled = job_states.settle({"5": "CANCELLED by 0"})
    assert settled == {"5": "FAILED"}
    assert warned[1].startswith(f"SLURM job 5: {what} for 300 s") and "cancelled, and ended" in warned[1], warned


def test_a_paused_job_let_go_on_is_never_failed_and_is_named_again_in_a_new_pause():
    controller = Controller(j5=("PENDING", "JobHeldUser"))
    job_states, clock, warned, _ = states(patience=60, held_patience=300, controller=controller)
    job_states.settle({"5": "PENDING"})
    clock.now += 200
    job_states.settle({"5": "PENDING"})
    controller.answers = False  # no answer: still held, as it was
    clock.now += 99
    assert job_states.settle({"5": "PENDING"}) == {"5": "PENDING"}
    controller.answers, controller.jobs["5"] = True, ("RUNNING", "None")  # released
    assert job_states.settle({"5": "RUNNING"}) == {"5": "RUNNING"}
    controller.jobs["5"] = ("SUSPENDED", "None")
    clock.now += 100
    job_states.settle({"5": "SUSPENDED"})
    clock.now += 60
    job_states.settle({"5": "SUSPENDED"})
    controller.jobs["5"] = ("RUNNING", "None")  # resumed
    clock.now += 1000
    assert job_states.settle({"5": "RUNNING"}) == {"5": "RUNNING"}
    assert controller.cancels == [] and len(warned) == 2, warned
    assert "PENDING (JobHeldUser)" in warned[0] and "is SUSPENDED for 60 s" in warned[1], warned


def test_a_job_held_before_the_status_command_listed_it_is_read_from_slurmctld_and_given_up():
    """sacct lists a job once slurmctld has sent it to slurmdbd, when it is eligible to run: a job held right after
    its submission never is, and the plugin waits on a job it never saw listed without bound."""
    controller = Controller(j5=("PENDING", "JobHeldAdmin"), j6=("PENDING", "Resources"))
    job_states, clock, warned, _ = states(patience=60, held_patience=300, controller=controller)
    assert job_states.settle({}, unlisted=["5", "6"]) == {"5": "PENDING"}  # 6 waits to be listed, as the plugin has it
    clock.now += 60
    assert job_states.settle({}, unlisted=["5", "6"]) == {"5": "PENDING"}
    assert len(warned) == 1 and warned[0].startswith("SLURM job 5 is PENDING (JobHeldAdmin) for 60 s"), warned
    clock.now += 240
    assert job_states.settle({}, unlisted=["5", "6"]) == {"5": "FAILED"} and controller.cancels == [["5"]]
    assert warned[1].startswith("SLURM job 5: PENDING (JobHeldAdmin) for 300 s"), warned


def test_a_never_listed_held_job_let_go_on_is_read_from_slurmctld_until_the_status_command_lists_it():
    controller = Controller(j5=("PENDING", "JobHeldUser"))
    job_states, clock, warned, _ = states(patience=60, held_patience=300, controller=controller)
    assert job_states.settle({}, unlisted=["5"]) == {"5": "PENDING"}
    controller.answers = False  # no answer: still held, as it was
    clock.now += 100
    assert job_states.settle({}, unlisted=["5"]) == {"5": "PENDING"} and len(warned) == 1
    controller.answers, controller.jobs["5"] = True, ("RUNNING", "None")  # released
    clock.now += 1000
    assert job_states.settle({}, unlisted=["5"]) == {"5": "RUNNING"}
    assert job_states.settle({"5": "RUNNING"}) == {"5": "RUNNING"}  # listed at last: the listing's word from now on
    controller.jobs["5"] = ("COMPLETED", "None")
    # dropped by the listing once it was listed: gone from it (given up after the patience), not read from slurmctld
    assert job_states.settle({}, unlisted=["5"]) == {"5": "PENDING"} and job_states.stuck_since["5"][0].startswith(
        "gone"
    )
    assert controller.cancels == [], controller.cancels


def test_patience_must_be_positive_and_the_held_patience_no_shorter():
    with pytest.raises(ValueError, match="patience must be > 0"):
        JobStates(0)
    with pytest.raises(ValueError, match="held_patience >= it"):
        JobStates(600, 300)


def test_slurmctld_view_is_read_from_squeue_and_a_forgotten_job_is_left_out():
    calls = []

    def squeue(out="", err="", rc=0):
        def run(cmd, **kwargs):
            calls.append(cmd)
            ids = cmd[-1].removeprefix("--jobs=").split(",")
            if callable(out):
                return out(ids)
            return CompletedProcess(cmd, rc, out, err)

        return run

    listing = "5|RUNNING|None\n6|PENDING|job requeued in held state\n7|COMPLETING|None\n"
    assert controller_view(["7", "5", "6"], squeue(listing)) == {
        "5": ("RUNNING", "None"),
        "6": ("PENDING", "job requeued in held state"),
        "7": ("COMPLETING", "None"),
    }
    assert calls[-1] == ["squeue", "--noheader", "--states=all", "--format=%i|%T|%r", "--jobs=5,6,7"]
    invalid = "slurm_load_jobs error: Invalid job id specified\n"
    assert controller_view(["8"], squeue(err=invalid, rc=1)) == {}
    assert controller_view(["8"], squeue(err="slurm_load_jobs error: Socket timed out\n", rc=1)) is None

    def one_known(ids):  # squeue fails for a single forgotten id; asked together, all were forgotten here
        if ids == ["5"]:
            return CompletedProcess([], 0, "5|CANCELLED|None\n", "")
        return CompletedProcess([], 1, "", invalid)

    assert controller_view(["5", "8"], squeue(one_known)) == {"5": ("CANCELLED", "None")}


def test_the_executor_cancels_through_the_plugins_scancel(monkeypatch):
    import snakemake_executor_plugin_slurm.job_cancellation as cancellation

    import snakemake_executor_plugin_margrpo_slurm as plugin

    sent, marked = [], []
    monkeypatch.setattr(cancellation.subprocess, "check_output", lambda cmd, **kw: sent.append(cmd) or "")
    monkeypatch.setattr(plugin, "mark_given_up", marked.extend)  # scontrol's part: tests/test_stopping.py

    class Executor:
        _submitted_job_clusters: set = set()
        logger = None

    plugin.Executor.cancel_given_up(Executor(), ["5", "6"])
    assert marked == ["5", "6"] and sent == [["scancel", "5", "6"]]


def test_the_slurm_profile_runs_the_bounded_executor_of_the_pinned_plugin():
    from importlib.metadata import version

    import snakemake_executor_plugin_margrpo_slurm as plugin

    profile = yaml.safe_load((REPO / "workflow/profiles/slurm/config.yaml").read_text())
    assert profile["executor"] == "margrpo-slurm"
    assert profile["margrpo-slurm-patience"] == plugin.ExecutorSettings().patience == 600
    assert profile["margrpo-slurm-held-patience"] == plugin.ExecutorSettings().held_patience == 3600
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
