"""The SLURM profile against a real two-node SLURM cluster (scripts/slurm-cluster.sh: slurmctld and two slurmd
"nodes" in network namespaces of their own, each with two stand-in GPUs): the geometry each GRPO job asks for, as
SLURM records it; the command run once per job and once per node; each first update equal to the 1-process one.

Only the train jobs go through SLURM: the stages before them run locally once (they are what the smoke DAG tests),
so this module costs a few minutes. `make test-slurm`; needs root (namespaces, daemons).
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
CLUSTER = REPO / "scripts/slurm-cluster.sh"
RUN = "train/toy-nova/toypref/fix/seed0"
SMALL = ["cpus_per_task=1", "mem_mb=1000", "runtime=30"]
TIMEOUT = 600  # a job status SLURM never reports fails the test here, naming where it stopped


@pytest.fixture(scope="module")
def cluster():
    if os.geteuid() != 0 or not shutil.which("ip") or not (shutil.which("apt-get") or shutil.which("slurmctld")):
        pytest.skip("the test cluster needs root, iproute2 and Debian's slurm packages (scripts/slurm-cluster.sh)")
    start = subprocess.run(["bash", str(CLUSTER), "start"], capture_output=True, text=True, timeout=600)
    assert start.returncode == 0, start.stdout[-2000:] + start.stderr[-3000:]
    yield
    subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, timeout=120)


def write_config(path: Path, name: str, processes: int, nodes: int, sharding: str, gpus: bool = True) -> Path:
    """The smoke config cut to one +Fix run of one step of 4 prompts x 2 images (whole groups on up to 4 processes)."""
    config = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    config.update(name=name, train_processes=processes, train_nodes=nodes, request_gpus=gpus)
    config["policies"]["toy-nova"]["sharding"] = sharding
    # one image a micro-batch whatever the process count: the same micro-batches, so the same gradient statistic
    micro = 8 // (processes * nodes)
    config["grpo"].update(
        steps=1, batch_prompts=4, group_size=2, micro_batches=micro, save_every=1, val_every=1, val_prompts=2
    )
    config["experiments"]["ladder"] = {
        "policies": ["toy-nova"],
        "rewards": ["toypref"],
        "variants": ["fix"],
        "seeds": [0],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake(workdir: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", HF_HUB_OFFLINE="1")
    # the options of many values (--configfile, --set-resources) each end at the next option
    cmd = [SNAKEMAKE, *args, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    try:
        return subprocess.run(
            [*cmd, "--configfile", str(config)], capture_output=True, text=True, env=env, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired as err:
        squeue = subprocess.run(["squeue", "-o", "%i %T %R"], capture_output=True, text=True).stdout
        raise AssertionError(
            f"snakemake ran past {TIMEOUT} s; squeue:\n{squeue}\n{(err.stderr or b'')[-3000:]}"
        ) from err


def through_slurm(workdir: Path, config: Path, target: str) -> tuple[str, list[str]]:
    """Run `target` through the workflow's SLURM profile; its output and the SLURM job ids it submitted."""
    out = snakemake(
        workdir,
        config,
        target,
        "--workflow-profile",
        str(REPO / "workflow/profiles/slurm"),
        "--slurm-status-command",
        "squeue",
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--latency-wait",
        "5",
        "--default-resources",
        *SMALL,
        "--set-resources",
        *[f"train:{kv}" for kv in SMALL],
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    return text, re.findall(r"SLURM jobid (\d+)", text)


def job_record(job_id: str) -> dict[str, str]:
    record = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True)
    return dict(w.split("=", 1) for w in record.stdout.split() if "=" in w)


def first_update(run: Path) -> dict[str, torch.Tensor]:
    return load_file(next((run / "state/ckpt-000001/policy").glob("*.safetensors")))


@pytest.fixture(scope="module")
def workdir(cluster, tmp_path_factory):
    """The shared stages and the reference runs, locally: one process, and four processes of one machine (the
    two-node job's processes each roll out what these do)."""
    work = tmp_path_factory.mktemp("slurm")
    for name, processes in (("slurm-ref", 1), ("slurm-4local", 4)):
        config = write_config(work / f"{name}.yaml", name, processes, 1, "full_shard", gpus=False)
        out = snakemake(work, config, f"results/{name}/{RUN}/summary.json", "--cores", "2")
        assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    return work


def assert_same_first_update(work: Path, name: str, reference: str, tolerance: float) -> float:
    """The run's first update and its logged row are the reference run's, to `tolerance` (relative); returns the
    difference. Across process counts the rollouts' images differ in their last bits (the rewards' mean by ~1e-7),
    and the smoke toy's groups nearly tie, so group normalisation (std + 1e-4) magnifies that into the advantages;
    with the same processes' batches the difference is the sums' order alone (docs/findings.md)."""
    base = load_file(next((work / "results").glob("pretrain/toy-nova-*/policy/*.safetensors")))
    one, two = first_update(work / f"results/{reference}/{RUN}"), first_update(work / f"results/{name}/{RUN}")
    assert one.keys() == two.keys()

    def step(w):
        return torch.cat([(w[k] - base[k]).flatten() for k in sorted(base)])

    u1, u2 = step(one), step(two)
    assert u1.norm() > 0, "the update changed nothing"
    diff = float((u2 - u1).norm() / u1.norm())
    assert diff < tolerance, (name, reference, diff)
    rows = [pd.read_csv(work / f"results/{n}/{RUN}/metrics.csv").iloc[0] for n in (reference, name)]
    for key in ("reward_mean", "grad_norm_ar"):
        assert rows[1][key] == pytest.approx(rows[0][key], rel=1e-3), key
    return diff


def test_a_single_node_job_is_one_task_with_its_gpus_and_runs_its_launcher_once(workdir):
    config = write_config(workdir / "one-node.yaml", "slurm-1node", 2, 1, "replicate")
    text, jobs = through_slurm(workdir, config, f"results/slurm-1node/{RUN}/summary.json")
    assert len(jobs) == 1, text[-3000:]  # the shared stages were already there: the train job alone
    job = job_record(jobs[0])
    assert (job["JobState"], job["NumNodes"], job["NumTasks"]) == ("COMPLETED", "1", "1"), job
    assert "gres:gpu:2" in (job.get("TresPerJob", "") + job.get("TresPerNode", "")), job
    log = (workdir / f"logs/slurm-1node/{RUN}.log").read_text()
    assert len(re.findall(r"margrpo\.infra\.launch: on node\d: 2 processes", log)) == 1, log[-3000:]
    processes = re.findall(r"margrpo: process (\d) of 2 on (node\d)", log)
    assert sorted(p for p, _ in processes) == ["0", "1"] and len({h for _, h in processes}) == 1, log[-3000:]
    assert_same_first_update(workdir, "slurm-1node", "slurm-ref", 1e-5)


def test_a_two_node_job_runs_torchrun_once_per_node_and_shards_within_nodes(workdir):
    config = write_config(workdir / "two-nodes.yaml", "slurm-2node", 2, 2, "hybrid_shard")
    text, jobs = through_slurm(workdir, config, f"results/slurm-2node/{RUN}/summary.json")
    assert len(jobs) == 1, text[-3000:]
    job = job_record(jobs[0])
    assert (job["JobState"], job["NumNodes"], job["NumTasks"]) == ("COMPLETED", "2", "2"), job
    assert job.get("TresPerNode") == "gres:gpu:2", job  # 2 GPUs on each node
    assert job["NodeList"] == "node[1-2]", job
    log = (workdir / f"logs/slurm-2node/{RUN}.log").read_text()
    launches = re.findall(
        r"margrpo\.infra\.launch: on (node\d), job (\d+): srun .*--rdzv-endpoint=([\d.]+):(\d+)", log
    )
    assert len(launches) == 1 and launches[0][:2] == ("node1", jobs[0]), log[-3000:]
    assert launches[0][2] == "10.77.0.11", launches  # the head node's address as SLURM knows it
    processes = re.findall(r"margrpo: process (\d) of 4 on (node\d) \(local (\d)\)", log)
    assert sorted(p for p, _, _ in processes) == ["0", "1", "2", "3"], log[-3000:]
    per_node = {h: sorted(local for _, host, local in processes if host == h) for h in ("node1", "node2")}
    assert per_node == {"node1": ["0", "1"], "node2": ["0", "1"]}, processes  # one torchrun of 2 on each node
    assert "hybrid_shard over a device mesh of shape (2, 2)" in log, log[-3000:]  # HSDP: 2 nodes x 2 shards
    assert_same_first_update(workdir, "slurm-2node", "slurm-4local", 1e-5)  # the same 4 processes' batches
    assert_same_first_update(workdir, "slurm-2node", "slurm-ref", 0.05)  # 1 process: see the docstring


PROBE = """
import os, socket, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
job = int(os.environ["SLURM_JOB_ID"])
t = torch.tensor([job, -job], dtype=torch.float64)
time.sleep(3)  # both jobs hold their rendezvous at once
dist.all_reduce(t, op=dist.ReduceOp.MAX)
out = f"{job} {dist.get_world_size()} {int(t[0])} {-int(t[1])} {socket.gethostname()}"
open(os.path.join(sys.argv[1], f"{job}-rank{dist.get_rank()}"), "w").write(out)
dist.destroy_process_group()
"""


def test_two_multi_node_jobs_on_the_same_first_node_keep_their_own_rendezvous(cluster, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    script = (
        f"#!/bin/bash\n{sys.executable} -m margrpo.infra.launch --nodes 2 --port auto 2 "
        f"{sys.executable} {tmp_path / 'probe.py'} {tmp_path}\n"
    )
    (tmp_path / "job.sh").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    sbatch = ["sbatch", "--parsable", "--nodes=2", "--ntasks=2", "--cpus-per-task=1", "--mem=500", "--gres=gpu:1"]
    jobs = [
        subprocess.run(
            [*sbatch, "-o", str(tmp_path / f"job{i}.log"), str(tmp_path / "job.sh")],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for i in range(2)
    ]
    deadline = time.time() + 300
    while time.time() < deadline and any(job_record(j)["JobState"] in ("PENDING", "RUNNING") for j in jobs):
        time.sleep(1)
    records = [job_record(j) for j in jobs]
    logs = [(tmp_path / f"job{i}.log").read_text() for i in range(2)]
    assert all(r["JobState"] == "COMPLETED" for r in records), [r["JobState"] for r in records] + logs
    assert records[0]["BatchHost"] == records[1]["BatchHost"] == "node1"
    assert records[1]["StartTime"] <= records[0]["EndTime"], "the two jobs did not overlap"
    ports = [re.search(r"--rdzv-endpoint=[\d.]+:(\d+)", log).group(1) for log in logs]
    assert ports[0] != ports[1], ports
    for job in jobs:
        seen = [(tmp_path / f"{job}-rank{r}").read_text().split() for r in range(4)]
        assert all(s[:4] == [job, "4", job, job] for s in seen), seen  # four processes, all of this job
        assert {s[4] for s in seen} == {"node1", "node2"}
