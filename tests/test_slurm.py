"""The SLURM profile against a real two-node SLURM cluster (scripts/slurm-cluster.sh: slurmctld and two slurmd
"nodes" in network namespaces of their own, each with two stand-in GPUs and two CPUs its tasks are bound to; node1's
own name resolves to 127.0.1.1 there, as on Debian): the geometry each GRPO job asks for, as SLURM records it; the
CPUs each process holds; the command run once per job and once per node; each first update equal to the 1-process
one; rendezvous ports of a job's own; a job stopped by the profile's warning signal, a real TIMEOUT, a `scancel`, a
preemption or a requeue saves within KillWait and resumes to the uninterrupted result (requeued by itself, spending
no retry, where the stop was planned; not undone by a retry where it was a `scancel`); a failing process ends its
job at once. Every job runs with the profile's own default resources.

Only the train jobs go through SLURM: the stages before them run locally once (they are what the smoke DAG tests).
`make test-slurm`; needs root (namespaces, daemons).
"""

import os
import re
import subprocess
import sys
import threading
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
RUN = "train/toy-nova/toypref/fix/seed0"
LONG = 600  # steps of the runs a stop interrupts: about a minute's work here, longer than SLURM's 30 s time checks
# (400 left 3 s to spare where the warning came 30 s after the time-limit update, and none once it came later)
MEM = {"train": {"runtime": 30, "mem_mb": 1500}}  # the config's `slurm` section, sized for the test cluster
TIMEOUT = 600  # a job status SLURM never reports fails the test here, naming where it stopped


def write_config(
    path: Path,
    name: str,
    processes: int,
    nodes: int,
    sharding: str,
    gpus: bool = True,
    threads: int = 1,
    steps: int = 1,
    **extra,
) -> Path:
    """The smoke config cut to one +Fix run of `steps` steps of 4 prompts x 2 images (whole groups on up to 4
    processes)."""
    config = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    config.update(name=name, train_processes=processes, train_nodes=nodes, request_gpus=gpus, threads=threads, **extra)
    config["slurm"] = {"account": "margrpo", "partition": "debug", "qos": "normal", **MEM}  # the site's three
    config["policies"]["toy-nova"]["sharding"] = sharding
    # one image a micro-batch whatever the process count: the same micro-batches, so the same gradient statistic
    micro = 8 // (processes * nodes)
    config["grpo"].update(
        steps=steps, batch_prompts=4, group_size=2, micro_batches=micro, save_every=1, val_every=1, val_prompts=2
    )
    if steps > 1:  # a validated checkpoint every 25 steps: a stop in between saves one of its own
        config["grpo"].update(save_every=25, val_every=25)
    config["experiments"]["ladder"] = {
        "policies": ["toy-nova"],
        "rewards": ["toypref"],
        "variants": ["fix"],
        "seeds": [0],
    }
    config["experiments"]["estimators"]["checkpoints"]["variants"] = []  # no GRPO run in this ladder to take them at
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def snakemake(workdir: Path, config: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", HF_HUB_OFFLINE="1")
    # the options of many values (--configfile, --set-resources) each end at the next option
    cmd = [SNAKEMAKE, *args, "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir)]
    # the runs share the stages before training (built locally by `workdir`); a config whose policy samples with
    # other settings (slow_steps) would rerun the base policy's quality report on its changed params
    cmd += ["--rerun-triggers", "mtime"]
    try:
        return subprocess.run(
            [*cmd, "--configfile", str(config)], capture_output=True, text=True, env=env, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired as err:
        squeue = subprocess.run(["squeue", "-o", "%i %T %R"], capture_output=True, text=True).stdout
        raise AssertionError(
            f"snakemake ran past {TIMEOUT} s; squeue:\n{squeue}\n{(err.stderr or b'')[-3000:]}"
        ) from err


def through_slurm(workdir: Path, config: Path, target: str, *args: str, expect: int = 0) -> tuple[str, list[str]]:
    """Run `target` through the workflow's SLURM profile; its output and the SLURM job ids it submitted."""
    out = snakemake(
        workdir,
        config,
        target,
        *args,
        "--workflow-profile",
        str(REPO / "workflow/profiles/slurm"),
        "--margrpo-slurm-init-seconds-before-status-checks",  # the plugin's default status command: sacct
        "2",
        "--margrpo-slurm-max-status-interval",  # a job seen ended within 5 s, not the plugin's growing 10-180 s
        "5",
        "--latency-wait",
        "5",
    )  # the profile's own default resources: its warning signal (--signal=TERM@300) goes with every job
    text = out.stdout + out.stderr
    assert out.returncode == expect, text[-6000:]
    return text, re.findall(r"SLURM jobid (\d+)", text)


def job_record(job_id: str) -> dict[str, str]:
    record = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True)
    return dict(w.split("=", 1) for w in record.stdout.split() if "=" in w)


def first_update(run: Path) -> dict[str, torch.Tensor]:
    return load_file(next((run / "state/ckpt-000001/policy").glob("*.safetensors")))


SLOW = dict(ar_steps=16, diffusion_steps=400)  # steps of about 6 s here, most of it the rollout: a stop lands in it
SLOW_REF = ("slurm-slow", 1, 3)  # the uninterrupted run of slow steps (name, processes, steps)


def slow_steps(config: Path) -> Path:
    """The run of `config` with long steps (every AR step of the toy's 16, many diffusion steps each) and no
    checkpoint before its last step."""
    spec = yaml.safe_load(config.read_text())
    spec["policies"]["toy-nova"]["sampling"].update(SLOW)
    spec["grpo"]["save_every"] = spec["grpo"]["steps"]
    config.write_text(yaml.safe_dump(spec, sort_keys=False))
    return config


@pytest.fixture(scope="module")
def workdir(cluster, tmp_path_factory):
    """The shared stages and the reference runs, locally: one process, and four processes of one machine (the
    two-node job's processes each roll out what these do)."""
    work = tmp_path_factory.mktemp("slurm")
    for name, processes, steps in (("slurm-ref", 1, 1), ("slurm-4local", 4, 1), ("slurm-long", 1, LONG), SLOW_REF):
        config = write_config(work / f"{name}.yaml", name, processes, 1, "full_shard", gpus=False, steps=steps)
        run_locally(work, slow_steps(config) if name == SLOW_REF[0] else config, name)
    return work


def run_locally(work: Path, config: Path, name: str) -> None:
    """The run of `config` to its end on this machine, outside SLURM: an uninterrupted reference."""
    out = snakemake(work, config, f"results/{name}/{RUN}/summary.json", "--cores", "2")
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]


# Against one process, another process count's first update is a sanity check, not an equality: each process scores
# its own images, and toypref's alignment term is not batch-invariant (its convolutions: 4.8e-7 between batches of
# 16 and 4 images, measured), which group normalisation of the smoke toy's nearly tied groups (std + 1e-4)
# magnifies by a factor the data sets, not float32 (0.060 seen for 4 processes). The exact check of a multi-node job
# is against the same processes on one machine (1e-5); this one only catches an update that went elsewhere.
ACROSS_PROCESS_COUNTS = 0.5


def assert_same_first_update(work: Path, name: str, reference: str, tolerance: float) -> float:
    """The run's first update and its logged row are the reference run's, to `tolerance` (relative); returns the
    difference. Across process counts the rollouts' images differ in their last bits (the rewards' mean by ~1e-7),
    and the smoke toy's groups nearly tie, so group normalisation (std + 1e-4) magnifies that into the advantages;
    with the same processes' batches the difference is the sums' order alone (docs/findings.md).

    Left out: the attention key biases (the middle third of each `qkv.bias`). Their gradient is exactly zero (a key
    bias adds q . b to every logit of a query's row, which the softmax cancels), so what the backward computes for
    them is rounding noise, and Adam's first step, about the sign of each gradient, turns that noise into +-lr:
    another kernel or thread count flips it (a 1-process job on 2 threads: 0.030 relative on an Intel Xeon)."""
    base = load_file(next((work / "results").glob("pretrain/toy-nova-*/policy/*.safetensors")))
    one, two = first_update(work / f"results/{reference}/{RUN}"), first_update(work / f"results/{name}/{RUN}")
    assert one.keys() == two.keys()

    def step(w):
        return torch.cat([_without_key_biases(k, w[k] - base[k]).flatten() for k in sorted(base)])

    u1, u2 = step(one), step(two)
    assert u1.norm() > 0, "the update changed nothing"
    diff = float((u2 - u1).norm() / u1.norm())
    assert diff < tolerance, (name, reference, diff)
    rows = [pd.read_csv(work / f"results/{n}/{RUN}/metrics.csv").iloc[0] for n in (reference, name)]
    for key in ("reward_mean", "grad_norm_ar"):  # the same magnification as the update's, and never above 1e-3
        assert rows[1][key] == pytest.approx(rows[0][key], rel=max(1e-3, tolerance)), key
    return diff


def _without_key_biases(name: str, delta: torch.Tensor) -> torch.Tensor:
    """`delta` with the key slice of an attention's fused qkv bias removed (see assert_same_first_update)."""
    if not name.endswith("attn.qkv.bias"):
        return delta
    width = delta.numel() // 3
    return torch.cat([delta[:width], delta[2 * width :]])


def worker_cpus(log: str, world: int) -> dict[str, int]:
    """Each process's CPUs (its affinity, as `margrpo train` logs it), by rank."""
    seen = re.findall(r"margrpo: process (\d) on node\d holds (\d+) CPUs", log)
    assert len(seen) == world, log[-3000:]
    return {rank: int(cpus) for rank, cpus in seen}


def test_a_one_process_gpu_job_is_one_task_with_one_gpu_and_its_threads(workdir):
    config = write_config(workdir / "one.yaml", "slurm-1gpu", 1, 1, "replicate", threads=2)
    text, jobs = through_slurm(workdir, config, f"results/slurm-1gpu/{RUN}/summary.json")
    assert len(jobs) == 1, text[-3000:]
    job = job_record(jobs[0])
    assert (job["JobState"], job["NumNodes"], job["NumTasks"], job["CPUs/Task"]) == ("COMPLETED", "1", "1", "2"), job
    assert "gres:gpu:1" in (job.get("TresPerJob", "") + job.get("TresPerNode", "")), job
    assert job["TimeLimit"] == "00:30:00" and job["MinMemoryNode"] == "1500M", job  # the config's `slurm` section
    assert (job["Account"], job["Partition"], job["QOS"]) == ("margrpo", "debug", "normal"), job
    assert_same_first_update(workdir, "slurm-1gpu", "slurm-ref", 1e-5)


def test_a_single_node_job_is_one_task_with_its_gpus_and_runs_its_launcher_once(workdir):
    config = write_config(workdir / "one-node.yaml", "slurm-1node", 2, 1, "replicate")
    text, jobs = through_slurm(workdir, config, f"results/slurm-1node/{RUN}/summary.json")
    assert len(jobs) == 1, text[-3000:]  # the shared stages were already there: the train job alone
    job = job_record(jobs[0])
    assert (job["JobState"], job["NumNodes"], job["NumTasks"]) == ("COMPLETED", "1", "1"), job
    assert job["CPUs/Task"] == "2", job  # train_processes x threads, not the profile's fixed 8
    assert "gres:gpu:2" in (job.get("TresPerJob", "") + job.get("TresPerNode", "")), job
    log = (workdir / f"logs/slurm-1node/{RUN}.log").read_text()
    assert len(re.findall(r"margrpo\.infra\.launch: on node\d: 2 processes", log)) == 1, log[-3000:]
    processes = re.findall(r"margrpo: process (\d) of 2 on (node\d)", log)
    assert sorted(p for p, _ in processes) == ["0", "1"] and len({h for _, h in processes}) == 1, log[-3000:]
    assert min(worker_cpus(log, 2).values()) >= 1
    assert_same_first_update(workdir, "slurm-1node", "slurm-ref", 1e-5)


def test_a_two_node_job_runs_torchrun_once_per_node_and_shards_within_nodes(workdir):
    """node1's name resolves to 127.0.1.1 on node1 (Debian's hosts line): the store is the launcher's, every
    torchrun its client, gloo on the interface of the node's SLURM address; nothing matches names."""
    config = write_config(workdir / "two-nodes.yaml", "slurm-2node", 2, 2, "hybrid_shard")
    text, jobs = through_slurm(workdir, config, f"results/slurm-2node/{RUN}/summary.json")
    assert len(jobs) == 1, text[-3000:]
    job = job_record(jobs[0])
    assert (job["JobState"], job["NumNodes"], job["NumTasks"], job["CPUs/Task"]) == ("COMPLETED", "2", "2", "2"), job
    assert job.get("TresPerNode") == "gres:gpu:2", job  # 2 GPUs on each node
    assert job["NodeList"] == "node[1-2]", job
    log = (workdir / f"logs/slurm-2node/{RUN}.log").read_text()
    launches = re.findall(
        r"margrpo\.infra\.launch: on (node\d), job (\d+): (srun .*) --node-agent ([\d.]+):(\d+)", log
    )
    assert len(launches) == 1 and launches[0][:2] == ("node1", jobs[0]), log[-3000:]
    assert "--cpus-per-task=2" in launches[0][2], launches  # srun does not inherit the job's -c
    assert launches[0][3] == "10.77.0.11", launches  # the head node's address as SLURM knows it
    agent = r"node agent on (node\d) \(node (\d) of 2\): address ([\d.]+) "
    agent += r"\((\w+); gloo (\w+), NCCL (\w+)\), (\d+) CPUs, GPUs ([\d,]+)"
    agents = sorted(re.findall(agent, log))  # each node's torchrun: its address, its task's CPUs and both GPUs
    assert agents == [
        ("node1", "0", "10.77.0.11", "eth0", "eth0", "eth0", "2", "0,1"),
        ("node2", "1", "10.77.0.12", "eth0", "eth0", "eth0", "2", "0,1"),
    ]
    processes = re.findall(r"margrpo: process (\d) of 4 on (node\d) \(local (\d)", log)
    assert sorted(p for p, _, _ in processes) == ["0", "1", "2", "3"], log[-3000:]
    per_node = {h: sorted(local for _, host, local in processes if host == h) for h in ("node1", "node2")}
    assert per_node == {"node1": ["0", "1"], "node2": ["0", "1"]}, processes  # one torchrun of 2 on each node
    assert "hybrid_shard over a device mesh of shape (2, 2)" in log, log[-3000:]  # HSDP: 2 nodes x 2 shards
    assert_same_first_update(workdir, "slurm-2node", "slurm-4local", 1e-5)  # the same 4 processes' batches
    assert_same_first_update(workdir, "slurm-2node", "slurm-ref", ACROSS_PROCESS_COUNTS)


def test_a_two_node_cpu_job_gives_each_process_its_threads(workdir):
    """No GPUs, one process of 2 threads per node: each process is bound to the 2 CPUs its node's task holds
    (without srun's --cpus-per-task, one)."""
    config = write_config(workdir / "cpu.yaml", "slurm-cpu", 1, 2, "full_shard", gpus=False, threads=2)
    text, jobs = through_slurm(workdir, config, f"results/slurm-cpu/{RUN}/summary.json")
    job = job_record(jobs[0])
    assert (job["JobState"], job["NumTasks"], job["CPUs/Task"]) == ("COMPLETED", "2", "2"), job
    assert "gpu" not in job.get("TresPerNode", "") + job.get("TresPerJob", ""), job
    log = (workdir / f"logs/slurm-cpu/{RUN}.log").read_text()
    assert worker_cpus(log, 2) == {"0": 2, "1": 2}, log[-3000:]
    assert_same_first_update(workdir, "slurm-cpu", "slurm-ref", ACROSS_PROCESS_COUNTS)


def metrics_without_timings(run: Path) -> pd.DataFrame:
    frame = pd.read_csv(run / "metrics.csv")
    return frame[[c for c in frame.columns if not any(t in c for t in ("time", "_s", "memory", "_mb"))]]


def assert_same_run(work: Path, name: str, reference: str = "slurm-long", steps: int = LONG) -> None:
    """The run's metrics (every column but timings) and final policy are the uninterrupted run's."""
    got, want = (metrics_without_timings(work / f"results/{n}/{RUN}") for n in (name, reference))
    assert list(got["step"]) == list(range(1, steps + 1)), got
    pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-5, atol=1e-7)
    a, b = (
        load_file(next((work / f"results/{n}/{RUN}/state").glob(f"ckpt-{steps:06d}/policy/*.safetensors")))
        for n in (name, reference)
    )
    assert all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a), name


def act_once_a_checkpoint_is_there(state: Path, *command: str, delay: float = 0) -> tuple[threading.Thread, dict]:
    """A thread that runs `command JOB` on the running job `delay` seconds after the run has its first checkpoint."""
    done = {}

    def act():
        deadline = time.time() + TIMEOUT
        while time.time() < deadline and not list(state.glob("ckpt-*")):
            time.sleep(0.5)
        time.sleep(delay)
        running = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True, text=True)
        done["job"] = running.stdout.split()[0] if running.stdout.split() else "none running"
        done["out"] = subprocess.run([*command, str(done["job"])], capture_output=True, text=True)

    thread = threading.Thread(target=act)
    thread.start()
    return thread, done


def resumed_at(log: str) -> int:
    return int(re.findall(r"resumed from .* at step (\d+)", log)[-1])


def cut_config(workdir: Path, name: str) -> Path:
    """The long run of a job that a stop interrupts: no periodic checkpoint before its last step (save_every =
    LONG), so a run that resumes at a step > 0 resumed from the save its stop made."""
    config = write_config(workdir / f"{name}.yaml", name, 1, 1, "replicate", gpus=False, steps=LONG)
    spec = yaml.safe_load(config.read_text())
    spec["grpo"]["save_every"] = LONG
    config.write_text(yaml.safe_dump(spec, sort_keys=False))
    return config


def cut_while_training(
    workdir: Path, name: str, cuts: list, delay: float = 8, once: str | None = None
) -> tuple[threading.Thread, dict]:
    """A thread that cuts the run's job once per entry of `cuts` (a function of the job id and its record),
    `delay` s after each segment began training: the first once the run folder is locked (or once the log shows
    the pattern `once`), each later one once the log says the run resumed once more. Records what each cut
    returned."""
    done = {"job": None, "cuts": []}
    state, log = workdir / f"results/{name}/{RUN}/state", workdir / f"logs/{name}/{RUN}.log.segments"

    def act():
        deadline = time.time() + TIMEOUT
        for i, cut in enumerate(cuts):
            while time.time() < deadline:
                text = log.read_text() if log.exists() else ""
                first = re.search(once, text) if once else (state / ".lock").exists()
                if first if i == 0 else text.count("resumed from") >= i:
                    break
                if (state.parent / "summary.json").exists():  # the run ended before this cut: the test says so
                    return
                time.sleep(0.5)
            time.sleep(delay)
            running = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True, text=True)
            done["job"] = done["job"] or (running.stdout.split() or ["none running"])[0]
            done["cuts"].append(cut(done["job"], job_record(done["job"])))

    thread = threading.Thread(target=act)
    thread.start()
    return thread, done


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True)


def elapsed_s(record: dict) -> float:
    return time.time() - time.mktime(time.strptime(record["StartTime"], "%Y-%m-%dT%H:%M:%S"))


def segment_states(job: str) -> list[str]:
    """sacct's state of each segment of a job (its requeues included), oldest first."""
    out = run("sacct", "-X", "-n", "-P", "--duplicates", "-j", job, "-o", "State").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def saved_within_killwait(log: str) -> list[float]:
    seconds = [float(s) for s in re.findall(r"saved ([\d.]+) s after it", log)]
    assert seconds and max(seconds) < 30, log[-3000:]  # KillWait
    return seconds


def test_a_train_job_cut_three_times_requeues_itself_and_spends_no_retry(workdir):
    """The profile's warning signal (`--signal=TERM@300`: the job's time limit moved to 5 minutes from now, which
    the run's own watch of its EndTime does not see), then twice the same SIGTERM by hand: each time the job saves
    and requeues itself under its id (slurm.requeues); Snakemake waits on the one job, spends none of the
    profile's retries, and sacct shows three segments REQUEUED and the last COMPLETED. The log keeps all four
    segments, each headed with the job id and its restart count."""
    name = "slurm-cuts"
    config = cut_config(workdir, name)

    def warn(job, record):  # SLURM's next check (every 30 s) sends the warning
        update = run("scontrol", "update", f"JobId={job}", f"TimeLimit={int(elapsed_s(record) // 60) + 5}")
        started = time.time()
        while time.time() < started + 120 and job_record(job)["JobState"] == "RUNNING":
            time.sleep(0.5)
        waited = f"{time.time() - started:.0f} s to the warning"  # said where the test fails
        return update, waited, run("scontrol", "update", f"JobId={job}", "TimeLimit=30")  # the next segment's own

    def term(job, record):
        return run("scancel", "--signal=TERM", job)

    thread, done = cut_while_training(workdir, name, [warn, term, term], delay=3)
    text, jobs = through_slurm(workdir, config, f"results/{name}/{RUN}/summary.json")
    thread.join()
    assert done["cuts"][0][0].returncode == 0 and jobs == [done["job"]], (jobs, done, text[-3000:])
    job = job_record(jobs[0])
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "3", (job, done)
    assert segment_states(jobs[0]) == ["REQUEUED"] * 3 + ["COMPLETED"], segment_states(jobs[0])
    log = (workdir / f"logs/{name}/{RUN}.log").read_text()
    headers = re.findall(rf"==== [\d: -]+: SLURM job {jobs[0]}, restart (\d+), on node\d ====", log)
    assert headers == ["0", "1", "2", "3"], log[-3000:]  # every segment kept (log.segments, copied to the log)
    assert log.count(f"SLURM job {jobs[0]} requeued (") == 3 and resumed_at(log) > 0, log[-3000:]
    saved_within_killwait(log)
    assert_same_run(workdir, name)


def test_a_train_job_cut_by_a_real_timeout_saves_within_killwait_and_its_retry_resumes(workdir):
    """The time limit moved to now (`scontrol update TimeLimit=0`: EndTime = now): SLURM's next check sends the
    warning and ends the job in the same breath (TIMEOUT: SIGTERM, then KillWait, 30 s). The run saves
    within it and does not requeue itself (Snakemake reads TIMEOUT as failed at once); the profile's one retry
    resumes from that save."""
    name = "slurm-timeout"
    config = cut_config(workdir, name)

    def timeout(job, record):  # the limit now: SLURM's next check (every 30 s) warns and ends the job at once
        return run("scontrol", "update", f"JobId={job}", "TimeLimit=0")

    thread, done = cut_while_training(workdir, name, [timeout], delay=3)
    text, jobs = through_slurm(workdir, config, f"results/{name}/{RUN}/summary.json")
    thread.join()
    assert done["cuts"][0].returncode == 0 and jobs[0] == done["job"] and len(jobs) == 2, (jobs, done, text[-3000:])
    assert segment_states(jobs[0]) == ["TIMEOUT"] and job_record(jobs[1])["JobState"] == "COMPLETED"
    log = (workdir / f"logs/{name}/{RUN}.log").read_text()
    assert resumed_at(log) > 0, log[-3000:]  # the stop's save (save_every = LONG)
    saved_within_killwait(log)
    assert_same_run(workdir, name)


def test_a_scancelled_train_job_saves_is_not_retried_and_the_next_snakemake_resumes_it(workdir):
    """A plain `scancel` (a person's or an admin's stop; Snakemake's own on Ctrl-C): the job saves within KillWait
    and is not requeued; the profile's retry stops at once with one line, so the rule fails saying the job was
    cancelled and how to go on; the next `snakemake` resumes from the save."""
    name = "slurm-scancel"
    config = cut_config(workdir, name)
    thread, done = cut_while_training(workdir, name, [lambda job, _: run("scancel", job)])
    text, jobs = through_slurm(workdir, config, f"results/{name}/{RUN}/summary.json", expect=1)
    thread.join()
    assert done["cuts"][0].returncode == 0 and jobs[0] == done["job"], (jobs, done, text[-3000:])
    assert segment_states(jobs[0]) == ["CANCELLED"], segment_states(jobs[0])
    assert "was cancelled (scancel, or Snakemake stopped): not requeued" in text, text[-3000:]
    assert "a retry does not undo that: run snakemake again to go on" in text, text[-3000:]
    saved_within_killwait((workdir / f"logs/{name}/{RUN}.log").read_text())
    through_slurm(workdir, config, f"results/{name}/{RUN}/summary.json")
    log = (workdir / f"logs/{name}/{RUN}.log").read_text()
    assert resumed_at(log) > 0, log[-3000:]
    assert_same_run(workdir, name)


def test_a_preempted_train_job_saves_requeues_itself_and_resumes(workdir):
    """The `urgent` partition preempts the job (PreemptMode=CANCEL: SLURM would end it PREEMPTED): it saves
    within KillWait and requeues itself, and Snakemake waits on the one job."""
    name = "slurm-preempt"
    config = cut_config(workdir, name)

    def preempt(job, record):
        urgent = ["sbatch", "--parsable", "-p", "urgent", f"--nodelist={record['NodeList']}", "-c", "2"]
        return run(*urgent, "--mem=500", "-t", "1", "-o", "/dev/null", "--wrap", "sleep 2")

    thread, done = cut_while_training(workdir, name, [preempt])
    text, jobs = through_slurm(workdir, config, f"results/{name}/{RUN}/summary.json")
    thread.join()
    assert done["cuts"][0].returncode == 0 and jobs == [done["job"]], (jobs, done, text[-3000:])
    job = job_record(jobs[0])
    assert job["JobState"] == "COMPLETED" and job["Restarts"] == "1", job
    log = (workdir / f"logs/{name}/{RUN}.log").read_text()
    assert f"SLURM job {jobs[0]} requeued (1 of at most" in log and resumed_at(log) > 0, log[-3000:]
    saved_within_killwait(log)
    assert_same_run(workdir, name)


def test_a_requeued_train_job_resumes_from_its_signals_save_and_snakemake_waits_for_it(workdir):
    """`scontrol requeue` from outside (what a preemption with PreemptMode=REQUEUE does): SIGTERM, the trainer
    saves; the same job id runs again, resumes from that save (no periodic checkpoint before the last step), and
    Snakemake reports success."""
    name = "slurm-requeue"
    config = cut_config(workdir, name)
    thread, done = cut_while_training(workdir, name, [lambda job, _: run("scontrol", "requeue", job)])
    text, jobs = through_slurm(workdir, config, f"results/{name}/{RUN}/summary.json")
    thread.join()
    assert done["cuts"][0].returncode == 0, done
    assert jobs == [done["job"]], (jobs, done)  # one submission: SLURM ran it again under its id
    job = job_record(jobs[0])
    assert job["JobState"] == "COMPLETED" and int(job["Restarts"]) == 1, job
    log = (workdir / f"logs/{name}/{RUN}.log").read_text()
    assert resumed_at(log) > 0, log[-3000:]
    assert_same_run(workdir, name)


def test_a_stop_in_mid_rollout_of_a_long_step_is_saved_within_seconds_and_resumes_to_the_uninterrupted_run(workdir):
    """Steps of about 6 s (16 AR steps of 400 diffusion steps each): a SIGTERM (the profile's warning signal,
    by hand) in step 2's rollout gives the step up before its next AR step, saves step 1's state a few seconds
    after the signal, requeues the job, and the resumed run repeats step 2 from its keyed streams to the
    uninterrupted run's metrics and weights."""
    name, (reference, _, steps) = "slurm-midroll", SLOW_REF
    config = slow_steps(write_config(workdir / f"{name}.yaml", name, 1, 1, "replicate", gpus=False, steps=steps))
    term = [lambda job, _: run("scancel", "--signal=TERM", job)]
    thread, done = cut_while_training(workdir, name, term, delay=1.5, once=rf"\b1/{steps} \[")  # step 1 logged
    text, jobs = through_slurm(workdir, config, f"results/{name}/{RUN}/summary.json")
    thread.join()
    assert done["cuts"][0].returncode == 0 and jobs == [done["job"]], (jobs, done, text[-3000:])
    assert segment_states(jobs[0]) == ["REQUEUED", "COMPLETED"], segment_states(jobs[0])
    log = (workdir / f"logs/{name}/{RUN}.log").read_text()
    assert "giving up step 2 in progress (in the rollout, before AR step" in log, log[-3000:]
    assert max(saved_within_killwait(log)) < 5 and resumed_at(log) == 1, log[-3000:]
    assert_same_run(workdir, name, reference, steps)


SHORT = 60  # steps of the two-node run a signal interrupts


@pytest.fixture(scope="module")
def two_node_reference(workdir):
    """The uninterrupted two-node run (one CPU process a node) that the interrupted ones must end as: its two
    processes on this machine, locally (the same ranks, groups and shards; test_a_two_node_job_runs_torchrun_once_...
    holds a two-node update against the same processes on one machine)."""
    config = write_config(workdir / "two-ref.yaml", "slurm-2ref", 2, 1, "full_shard", gpus=False, steps=SHORT)
    run_locally(workdir, config, "slurm-2ref")
    return "slurm-2ref"


def test_a_two_node_job_sent_sigterm_saves_and_requeues_itself_to_the_uninterrupted_run(workdir, two_node_reference):
    """`scancel --signal=TERM` (what the profile's warning or a preemption's grace sends every step): srun passes
    it to each node's torchrun, torchrun to its worker; the workers save and the main process requeues the job
    (it is still RUNNING: a planned stop); it resumes from that save, not from the last periodic checkpoint."""
    config = write_config(workdir / "term.yaml", "slurm-term", 1, 2, "full_shard", gpus=False, steps=SHORT)
    state = workdir / f"results/slurm-term/{RUN}/state"
    thread, done = act_once_a_checkpoint_is_there(state, "scancel", "--signal=TERM", delay=5)  # a few steps on
    text, jobs = through_slurm(workdir, config, f"results/slurm-term/{RUN}/summary.json")
    thread.join()
    assert done["out"].returncode == 0 and jobs == [done["job"]], (jobs, done, text[-3000:])
    assert job_record(jobs[0])["Restarts"] == "1" and segment_states(jobs[0]) == ["REQUEUED", "COMPLETED"]
    log = (workdir / f"logs/slurm-term/{RUN}.log").read_text()
    assert resumed_at(log) > 25, log[-3000:]  # saved on the signal (the periodic checkpoint is step 25's)
    saved_within_killwait(log)
    assert_same_run(workdir, "slurm-term", two_node_reference, SHORT)


PROBE = """
import os, socket, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
job = int(os.environ["SLURM_JOB_ID"])
if str(dist.get_rank()) == os.environ.get("FAIL_RANK"):
    os._exit(3)  # one process fails at once; the others would wait in the collective below
t = torch.tensor([job, -job], dtype=torch.float64)
time.sleep(float(os.environ.get("HOLD", "3")))  # both jobs hold their rendezvous at once
dist.all_reduce(t, op=dist.ReduceOp.MAX)
out = f"{job} {dist.get_world_size()} {int(t[0])} {-int(t[1])} {socket.gethostname()}"
open(os.path.join(sys.argv[1], f"{job}-rank{dist.get_rank()}"), "w").write(out)
dist.destroy_process_group()
"""


def submit_probe(tmp_path: Path, name: str, port: str = "auto", hold: bool = False, **env: str) -> str:
    """A 2-node job of 2 processes a node running PROBE through the launcher; its job id."""
    (tmp_path / "probe.py").write_text(PROBE)
    script = (
        f"#!/bin/bash\n{sys.executable} -m margrpo.infra.launch --nodes 2 --port {port} 2 "
        f"{sys.executable} {tmp_path / 'probe.py'} {tmp_path}\n"
    )
    (tmp_path / "job.sh").write_text(script)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | env
    environ["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), environ.get("PYTHONPATH", "")])
    sbatch = ["sbatch", "--parsable", "--nodes=2", "--ntasks=2", "--cpus-per-task=1", "--mem=500", "--gres=gpu:1"]
    sbatch += ["--hold"] if hold else []
    return subprocess.run(
        [*sbatch, "-o", str(tmp_path / f"{name}.log"), str(tmp_path / "job.sh")],
        env=environ,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def wait_for(jobs: list[str], seconds: float = 300) -> list[dict[str, str]]:
    deadline = time.time() + seconds
    while time.time() < deadline and any(job_record(j)["JobState"] in ("PENDING", "RUNNING") for j in jobs):
        time.sleep(0.5)
    return [job_record(j) for j in jobs]


def endpoint_port(log: str) -> int:
    return int(re.search(r"--node-agent [\d.]+:(\d+)", log).group(1))


def test_two_multi_node_jobs_on_the_same_first_node_keep_their_own_rendezvous(cluster, tmp_path):
    jobs = [submit_probe(tmp_path, f"job{i}") for i in range(2)]
    records = wait_for(jobs)
    logs = [(tmp_path / f"job{i}.log").read_text() for i in range(2)]
    assert all(r["JobState"] == "COMPLETED" for r in records), [r["JobState"] for r in records] + logs
    assert records[0]["BatchHost"] == records[1]["BatchHost"] == "node1"
    assert records[1]["StartTime"] <= records[0]["EndTime"], "the two jobs did not overlap"
    ports = [endpoint_port(log) for log in logs]
    assert ports[0] != ports[1], ports
    for job in jobs:
        seen = [(tmp_path / f"{job}-rank{r}").read_text().split() for r in range(4)]
        assert all(s[:4] == [job, "4", job, job] for s in seen), seen  # four processes, all of this job
        assert {s[4] for s in seen} == {"node1", "node2"}


def hold_port(port: int) -> subprocess.Popen:
    """Another job's store on node1's address at `port`: a listener in node1's network namespace."""
    listener = (
        "import socket, sys, time; s = socket.create_server(('10.77.0.11', int(sys.argv[1]))); "
        "print('ready', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen(
        ["nsenter", "--net=/run/netns/mg-node1", sys.executable, "-c", listener, str(port)],
        stdout=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | {"SLURM_JOB_ID": "999999"},
    )
    assert holder.stdout.readline().strip() == "ready"
    return holder


def test_a_taken_port_is_stepped_past_or_named_when_fixed(cluster, tmp_path):
    """The port a job derives from its id is held by another job's store: `auto` takes the next free one (its own
    store: the job's four processes and no one else's); a fixed train_port fails at once, naming the holder."""
    job = submit_probe(tmp_path, "auto", hold=True)
    derived = 20000 + int(job) % 10000
    holder = hold_port(derived)
    try:
        subprocess.run(["scontrol", "release", job], check=True)
        (record,) = wait_for([job])
        log = (tmp_path / "auto.log").read_text()
        assert record["JobState"] == "COMPLETED", log[-3000:]
        assert f"port {derived} is taken; the rendezvous uses {derived + 1}" in log, log[-3000:]
        assert endpoint_port(log) == derived + 1
        seen = [(tmp_path / f"{job}-rank{r}").read_text().split() for r in range(4)]
        assert all(s[:4] == [job, "4", job, job] for s in seen), seen
        fixed = submit_probe(tmp_path, "fixed", port=str(derived))
        (record,) = wait_for([fixed], 120)
        log = (tmp_path / "fixed.log").read_text()
        assert record["JobState"] == "FAILED", log[-3000:]
        assert f"the rendezvous port {derived} on 10.77.0.11 is taken by SLURM job 999999 (pid" in log, log[-3000:]
    finally:
        holder.kill()


def test_a_failing_process_ends_its_multi_node_job_at_once_naming_its_rank(cluster, tmp_path):
    """Rank 3 (node2) exits 3 at once; the others would wait for it for 10 minutes: the job is FAILED within
    seconds of it, and the log names the rank."""
    job = submit_probe(tmp_path, "failing", FAIL_RANK="3", HOLD="600")
    (record,) = wait_for([job], 300)
    log = (tmp_path / "failing.log").read_text()
    assert record["JobState"] == "FAILED", (record, log[-3000:])
    start, end = (time.mktime(time.strptime(record[k], "%Y-%m-%dT%H:%M:%S")) for k in ("StartTime", "EndTime"))
    assert end - start < 60, (record["StartTime"], record["EndTime"], log[-3000:])
    assert re.search(r"rank\s*:\s*3 \(local_rank: 1\)", log) and "exitcode  : 3" in log, log[-3000:]


def test_a_process_failing_on_one_node_fails_the_job_and_snakemake_names_its_rank_and_log(workdir, tmp_path):
    """node2's reward model is unreadable there (an empty file bound over it in node2's mount namespace): rank 1
    fails at start, rank 0 would wait for it in a collective; srun ends the job, and Snakemake's error names the
    log and, in it, the rank that failed."""
    weights = next((workdir / "results").glob("toypref/*/model/*.safetensors"))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    slurmd = Path("/run/slurmd-node2.pid").read_text().strip()
    mount = ["nsenter", "-t", slurmd, "-m", "mount", "--bind", str(empty), str(weights)]
    subprocess.run(mount, check=True)
    try:
        config = write_config(workdir / "fail.yaml", "slurm-fail", 1, 2, "full_shard", gpus=False)
        started = time.time()
        text, jobs = through_slurm(
            workdir, config, f"results/slurm-fail/{RUN}/summary.json", "--retries", "0", expect=1
        )
        elapsed = time.time() - started
    finally:
        subprocess.run(["nsenter", "-t", slurmd, "-m", "umount", str(weights)], check=True)
    (job,) = jobs
    record = job_record(job)
    assert record["JobState"] == "FAILED", record
    log = f"logs/slurm-fail/{RUN}.log"
    assert "Error in rule train" in text and log in text, text[-4000:]
    assert re.search(r"host\s*:\s*node2\s+rank\s*:\s*1 \(local_rank: 0\)", text), text[-4000:]
    assert elapsed < 120, elapsed  # not rank 0's collective timeout (30 minutes)
