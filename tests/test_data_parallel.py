"""Data parallel GRPO on the gloo backend (margrpo.infra.launch, as the train rules run it; 2 CPU processes): the same
update as one process, one writer, and a killed run that resumes to the uninterrupted result. The launcher
listens on the loopback interface only, and one failing process stops the job."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from margrpo.grpo.engine import shard
from margrpo.grpo.random_streams import group_generators

WORKER = Path(__file__).parent / "dp_worker.py"
SRC = Path(__file__).parents[1] / "src"


def torchrun(nproc: int, mode: str, out: Path, **env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "margrpo.infra.launch", str(nproc), sys.executable, str(WORKER), mode, str(out)]
    environ = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        **env,
    }
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


@pytest.fixture(scope="module")
def one_process_updates(tmp_path_factory):
    """The 1-process first updates, by policy (computed once each)."""
    cache = {}

    def get(policy: str) -> dict:
        if policy not in cache:
            out = tmp_path_factory.mktemp(f"one-{policy}")
            ok(torchrun(1, "first-update", out, POLICY=policy))
            cache[policy] = torch.load(out / "first_update.pt")
        return cache[policy]

    return get


@pytest.fixture(scope="module")
def one_process_update(one_process_updates):
    return one_process_updates("toy")


@pytest.mark.parametrize(
    "policy,sharding",
    [
        ("toy", "replicate"),
        ("toy", "full_shard"),
        ("toy", "shard_grad_op"),
        ("nova", "full_shard"),
        ("harmon", "shard_grad_op"),
    ],
)
def test_two_processes_take_the_one_process_first_update(tmp_path, one_process_updates, policy, sharding):
    """Each process rolls out one of the two groups; DDP (replicate) or FSDP2 sums the gradients: the 1-process step
    on the whole batch (1e-5), for GRPO, +Fix, +MTE/+Sim, LoRA, a chunked replay (replay_chunk 1) and gradient
    checkpointing (AR and head blocks recomputed in backward, inside FSDP's groups), on the toy and the tiny NOVA and
    Harmon (as the paper configs shard them). The gradient-variance probe gives what its estimator says from the
    one-process micro-batch gradients: the same statistic under DDP, the per-process rounds' under FSDP."""
    ok(torchrun(2, "first-update", tmp_path, SHARDING=sharding, POLICY=policy))
    one, two = one_process_updates(policy), torch.load(tmp_path / "first_update.pt")
    assert set(one) == set(two) and len(one) >= 4
    for variant in one:
        if policy == "toy":
            assert relative_error(one[variant]["params"], _initial(variant)) > 1e-6, (
                f"{variant}: the update changed nothing"
            )
        assert relative_error(two[variant]["grads"], one[variant]["grads"]) < 1e-5, variant
        assert relative_error(two[variant]["params"], one[variant]["params"]) < 1e-5, variant
        for key in ("reward_mean", "reward_std", "adv_std", "policy_loss", "kl_paper", "grad_norm_ar"):
            assert two[variant]["row"][key] == pytest.approx(one[variant]["row"][key], rel=1e-4, abs=1e-7), (
                variant,
                key,
            )
        assert one[variant]["row"]["grad_var_ar"] > 0, variant  # a statistic to compare, not two NaNs
        assert two[variant]["row"]["grad_var_ar"] == pytest.approx(
            expected_variance(one[variant], sharding), rel=1e-4
        ), variant
    assert "mte_frac" in two["mte-sim"]["row"]


def test_bf16_first_updates_of_replicate_and_full_shard_agree(tmp_path):
    """Mixed precision is applied once, by autocast, whatever the sharding (FSDP gathers fp32 parameters and casts
    nothing): under bf16 the first updates of `replicate` and `full_shard` agree as closely as in fp32 (1e-5; seen
    2e-7 and 1e-7), while bf16 moves either from the fp32 update by 1e-2 (seen 1.5e-2 and 1.9e-2): the sharding
    changes the summation order, not the rounding."""
    runs = {}
    for sharding in ("replicate", "full_shard"):
        ok(torchrun(2, "first-update", tmp_path / sharding, SHARDING=sharding, PRECISION="bf16", ONLY="grpo,fix"))
        runs[sharding] = torch.load(tmp_path / sharding / "first_update.pt")
    ok(torchrun(2, "first-update", tmp_path / "fp32", SHARDING="replicate", ONLY="grpo,fix"))
    fp32 = torch.load(tmp_path / "fp32" / "first_update.pt")
    for variant in ("grpo", "fix"):
        ddp, fsdp = runs["replicate"][variant], runs["full_shard"][variant]
        between = relative_error(fsdp["grads"], ddp["grads"])
        print(
            f"{variant}: bf16 full_shard vs replicate {between:.2e}; replicate bf16 vs fp32 "
            f"{relative_error(ddp['grads'], fp32[variant]['grads']):.2e}; full_shard bf16 vs fp32 "
            f"{relative_error(fsdp['grads'], fp32[variant]['grads']):.2e}"
        )
        assert between < 1e-5, variant
        assert relative_error(ddp["grads"], fp32[variant]["grads"]) > 1e-3  # bf16 did round (not fp32 in disguise)
        assert relative_error(fsdp["grads"], fp32[variant]["grads"]) > 1e-3
        assert fsdp["row"]["policy_loss"] == pytest.approx(ddp["row"]["policy_loss"], rel=1e-4, abs=1e-7)


@pytest.mark.parametrize(
    "policy,sharding", [("toy", "full_shard"), ("nova", "full_shard"), ("harmon", "shard_grad_op")]
)
def test_the_main_process_alone_builds_the_policy_and_the_others_take_the_same_step(
    tmp_path, one_process_updates, policy, sharding
):
    """Under FSDP the main process alone builds the policy and reads its weights (grpo.parallel.build_policy); the
    other starts every parameter on the meta device and receives only its shards: the first update is the one of
    two eagerly built processes (the toy: bit for bit) and of one process (1e-5), the KL reference's included."""
    ok(torchrun(2, "first-update", tmp_path / "meta", SHARDING=sharding, POLICY=policy, META="1"))
    built = [json.loads((tmp_path / "meta" / f"built-rank{r}.json").read_text()) for r in (0, 1)]
    meta = torch.load(tmp_path / "meta" / "first_update.pt")
    assert built[0]["loads"] == list(meta) and built[1]["loads"] == []  # the weights read once, by rank 0
    assert all(built[1]["meta"][v] > 0 for v in meta) and not any(built[0]["meta"].values())
    one = one_process_updates(policy)
    for variant in meta:
        assert relative_error(meta[variant]["params"], one[variant]["params"]) < 1e-5, variant
        assert meta[variant]["row"]["kl_paper"] == pytest.approx(
            one[variant]["row"]["kl_paper"], rel=1e-4, abs=1e-7
        ), variant
    if policy == "toy":
        ok(torchrun(2, "first-update", tmp_path / "eager", SHARDING=sharding, POLICY=policy))
        eager = torch.load(tmp_path / "eager" / "first_update.pt")
        for variant in meta:
            for a, b in zip(meta[variant]["params"], eager[variant]["params"]):
                assert torch.equal(a, b), variant
            for key in ("reward_mean", "policy_loss", "kl_paper", "grad_norm_ar", "grad_var_ar"):
                assert meta[variant]["row"][key] == eager[variant]["row"][key], (variant, key)


def expected_variance(one: dict, sharding: str, world: int = 2) -> float:
    """The gradient-variance probe's value for two processes, from the one-process run's micro-batch gradients
    (4 of one image each; process r takes images 2r, 2r + 1): under DDP the variance across the four (each process
    reads its own in DDP's hook), under FSDP `world` times the variance across the two rounds, each the sum of the
    processes' c-th micro-batches (what the reduced shards show)."""
    g = torch.stack(one["micro_grads"])  # [4, P]
    if sharding != "replicate":
        g = g.view(world, -1, g.shape[1]).sum(0)  # round c: process 0's c-th + process 1's c-th
    n, total = len(g), g.sum(0)
    var = (n**2 * g.square().sum() - n * total.square().sum()) / ((n - 1) * g.shape[1])
    return float(var) * (world if sharding != "replicate" else 1)


def _initial(variant: str) -> list[torch.Tensor]:
    sys.path.insert(0, str(Path(__file__).parent))
    from dp_worker import VARIANTS
    from helpers import tiny_policy

    from margrpo.policy.lora import add_lora

    policy = tiny_policy("flow", seed=1)
    if VARIANTS[variant].get("lora"):
        torch.manual_seed(0)
        add_lora(policy, VARIANTS[variant]["lora"])
    return [p.detach().clone() for p in policy.parameters()]


@pytest.mark.parametrize("sharding", ["replicate", "full_shard", "full_shard+lora"])
def test_only_rank_zero_writes_and_a_killed_run_resumes_to_the_same_result(tmp_path, sharding):
    """Killed as step 4 begins (rank 1 SIGKILLed; step 2's training state, written behind step 3, was named the
    checkpoint to resume from before step 4), the run resumes from the step-2 checkpoint with one process and with
    two: each process saved its shards of the training state (torch.distributed.checkpoint), which a load reshards
    to whatever reads them (FSDP with an EMA of the trained parameters, and LoRA's adapters, included)."""
    sharding, lora = sharding.split("+")[0], "+lora" in sharding  # LoRA: adapters beside the state dict
    ema = {"EMA": "0.9"} if sharding == "full_shard" else {}
    ema.update({"LORA": "1"} if lora else {})
    ok(torchrun(2, "train", tmp_path / "straight", SHARDING=sharding, **ema))
    writes = [json.loads((tmp_path / "straight" / f"writes-rank{r}.json").read_text()) for r in range(2)]
    assert any("trainer.pt" in w for w in writes[0]) and any("metrics.csv" in w for w in writes[0])
    # the other process writes its shards of the training state (torch.distributed.checkpoint) and no other file
    assert writes[1] and all(re.search(r"ckpt-\d{6}/\.train\.\w+\.tmp/__1_\d+\.distcp$", w) for w in writes[1]), (
        writes[1]
    )
    rows = (tmp_path / "straight" / "run" / "metrics.csv").read_text().splitlines()
    assert len(rows) == 5  # header + 4 steps, written once

    killed = torchrun(2, "train", tmp_path / "killed", KILL_AT_STEP="4", SHARDING=sharding, **ema)
    assert killed.returncode != 0 and not (tmp_path / "killed" / "params-rank0.pt").exists()
    assert (tmp_path / "killed" / "run" / "state" / "trainer.pt").exists()  # the step-2 checkpoint
    shutil.copytree(tmp_path / "killed", tmp_path / "killed-2")
    resumed_2 = torchrun(2, "train", tmp_path / "killed-2", SHARDING=sharding, **ema)
    ok(resumed_2)
    assert "resumed from" in resumed_2.stderr and "at step 2" in resumed_2.stderr
    resumed = torchrun(1, "train", tmp_path / "killed", **ema)
    ok(resumed)
    assert "resumed from" in resumed.stderr and "at step 2" in resumed.stderr
    a, b, c = (torch.load(tmp_path / d / "params-rank0.pt") for d in ("straight", "killed", "killed-2"))
    assert relative_error(b, a) < 1e-5 and relative_error(c, a) < 1e-6
    straight, again = ((tmp_path / d / "run" / "metrics.csv").read_text().splitlines() for d in ("straight", "killed"))
    assert len(again) == 5 and [r.split(",")[:2] for r in again[:3]] == [r.split(",")[:2] for r in straight[:3]]
    for x, y in zip(again[3:], straight[3:]):  # steps 3-4 on one process: the same numbers up to summation order
        assert float(x.split(",")[1]) == pytest.approx(float(y.split(",")[1]), rel=1e-4, abs=1e-6)


def test_a_stop_on_one_process_in_mid_rollout_gives_the_step_up_on_both_and_resumes_to_the_same_bits(tmp_path):
    """Issue 70: rank 1 alone is sent SIGTERM as AR step 2 of step 2 begins (shard_grad_op: FSDP keeps the gathered
    weights after each forward). Both processes agree at the next check, give step 2 up and save the state of its
    start (step 1, which no periodic checkpoint holds); resumed on two processes, the run ends with the
    uninterrupted run's metrics and weights, bit for bit."""
    env = dict(SHARDING="shard_grad_op")
    ok(torchrun(2, "train", tmp_path / "straight", **env))
    ok(torchrun(2, "train", tmp_path / "stopped", STOP_AT_STEP="2", **env))
    stopped = [json.loads((tmp_path / "stopped" / f"stopped-rank{r}.json").read_text()) for r in range(2)]
    assert stopped == [
        {"stopped": "another process was asked to stop", "step": 1},
        {"stopped": "SIGTERM received", "step": 1},
    ]
    state = tmp_path / "stopped" / "run" / "state"
    assert torch.load(state / "trainer.pt", weights_only=True)["step"] == 1
    resumed = torchrun(2, "train", tmp_path / "stopped", **env)
    ok(resumed)
    assert "resumed from" in resumed.stderr and "at step 1" in resumed.stderr
    a, b = (torch.load(tmp_path / d / "params-rank0.pt") for d in ("straight", "stopped"))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    straight, again = (_untimed_rows(tmp_path / d / "run" / "metrics.csv") for d in ("straight", "stopped"))
    assert len(again) == 4 and again == straight


def _untimed_rows(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if not k.endswith(("_s", "_mb"))} for r in csv.DictReader(f)]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_rendezvous_through_torchrun_and_take_the_one_process_update(tmp_path, one_process_update):
    """A 2-node job as the SLURM launcher starts it (`launch.multi_node_command`: torchrun once per node, c10d
    rendezvous on the first node), both "nodes" on this machine: FSDP across them takes the 1-process step."""
    from margrpo.infra.launch import multi_node_command

    command = multi_node_command(
        2,
        1,
        f"127.0.0.1:{free_port()}",
        "test-two-nodes",
        [sys.executable, str(WORKER), "first-update", str(tmp_path)],
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SHARDING": "full_shard",
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    nodes = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in nodes]
    assert all(p.returncode == 0 for p in nodes), outputs[0][-3000:] + outputs[1][-3000:]
    one, two = one_process_update, torch.load(tmp_path / "first_update.pt")
    for variant in ("grpo", "fix", "lora"):
        assert relative_error(two[variant]["params"], one[variant]["params"]) < 1e-5, variant
        assert two[variant]["row"]["grad_var_ar"] == pytest.approx(
            expected_variance(one[variant], "full_shard"), rel=1e-4
        ), variant


LISTENER = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}"), "w").write(str(int(t.item())))
if dist.get_rank() == 1 and os.environ.get("EXIT_RANK1"):
    # dies at once: sys.exit with a live gloo group can abort in torch's teardown (134)
    os._exit(int(os.environ["EXIT_RANK1"]))
time.sleep(float(os.environ.get("HOLD", "0")))
"""


def listening(pids: set[int]) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp* write them) of the TCP sockets these processes listen on."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    rows = [line.split() for f in ("/proc/net/tcp", "/proc/net/tcp6") for line in Path(f).read_text().splitlines()[1:]]
    return {r[1].split(":")[0] for r in rows if r[3] == "0A" and r[9] in inodes}


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_the_launcher_listens_on_loopback_only_and_stops_on_a_failure(tmp_path):
    """Issue 27: torchrun --standalone listened on every interface (`::`). The launcher's store and gloo's sockets
    are on 127.0.0.1; a process that fails stops the job with its exit code."""
    import psutil

    script = tmp_path / "w.py"
    script.write_text(LISTENER)
    cmd = [sys.executable, "-m", "margrpo.infra.launch", "2", sys.executable, str(script), str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), "HOLD": "20"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not all((tmp_path / f"rank{r}").exists() for r in range(2)) and proc.poll() is None:
            time.sleep(0.2)
        family = {proc.pid} | {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        addresses = listening(family)
    finally:
        proc.terminate()  # the launcher passes SIGTERM on to its processes
        proc.wait(timeout=60)
    assert addresses and addresses <= {"0100007F", "00000000000000000000000001000000"}, addresses  # 127.0.0.1 / ::1
    assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == ["2", "2"]
    start = time.time()
    failed = subprocess.run(
        cmd, env={**env, "HOLD": "60", "EXIT_RANK1": "3"}, capture_output=True, text=True, timeout=120
    )
    assert failed.returncode == 3 and time.time() - start < 40, failed.stderr[-2000:]
    assert "process 1 of 2 exited with code 3; stopping the others" in failed.stderr


def test_the_rendezvous_port_steps_past_a_taken_one_or_names_its_holder_when_fixed():
    """`launch.reserve_port`: a port another process listens on is never joined; `auto` takes the next free one,
    a fixed one is an error that names the process (and its SLURM job) holding it."""
    import socket

    from margrpo.infra.launch import reserve_port

    # the holder as another job (its SLURM_JOB_ID in its environment) on a port the OS found free, and ours on the
    # port below it where that one is free too: two neighbouring ports no other process holds
    holder = "import socket, sys, time; s = socket.create_server(('127.0.0.1', 0)); print(s.getsockname()[1]); "
    holder += "sys.stdout.flush(); time.sleep(60)"
    for _ in range(50):
        other = subprocess.Popen(
            [sys.executable, "-c", holder],
            env={**os.environ, "SLURM_JOB_ID": "4242"},
            stdout=subprocess.PIPE,
            text=True,
        )
        port = int(other.stdout.readline()) - 1
        try:
            taken = socket.create_server(("127.0.0.1", port))
            break
        except OSError:
            other.kill()
    try:
        with reserve_port("127.0.0.1", port, fixed=False) as mine:
            assert mine.getsockname()[1] >= port + 2  # past ours and past the other "job"'s
        with pytest.raises(
            SystemExit, match=rf"port {port + 1} on 127.0.0.1 is taken by SLURM job 4242 \(pid {other.pid}\)"
        ):
            reserve_port("127.0.0.1", port + 1, fixed=True)
        with pytest.raises(SystemExit, match="is not an address of"):
            reserve_port(
                "10.255.255.254", port, fixed=False
            )  # not this machine: the launcher is not on the first node
    finally:
        other.kill()
        taken.close()
