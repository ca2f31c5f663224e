"""The train jobs a dry-run of the Snakefile plans (its printout, read job by job): the Fig. 7 grid as train jobs
under ablation/, torchrun over several processes or nodes and the SLURM resources each asks for, the precision every
stage runs at, the second seed set's variants. The DAG and the config checks: test_workflow_config.py."""

import json
import re
import subprocess

import yaml
from dry_runs import REPO, SNAKEMAKE

from margrpo.experiment.config import load_config


def _dry_run_train_jobs(tmp_path, overrides: dict) -> tuple[str, list[str]]:
    """A dry run of the smoke config with `overrides` on top, for 8 cores and 8 GPUs: its printout and the train
    jobs."""
    cfg = tmp_path / "overrides.yaml"
    cfg.write_text(yaml.safe_dump(overrides))
    args = [
        "-n",
        "-p",
        "--cores",
        "8",
        "--resources",
        "gpu=8",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--configfile",
        str(REPO / "config/smoke.yaml"),
        str(cfg),
    ]
    out = subprocess.run([SNAKEMAKE, *args], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = [j for j in out.stdout.split("\n\n") if re.search(r"^rule train:", j, re.M)]
    assert jobs
    return out.stdout, jobs


def test_ablation_points_are_train_jobs_under_ablation(tmp_path):
    """One train rule runs the ladder and the Fig. 7 grid: each grid point of the smoke table and seed is a train job
    writing results/smoke/ablation/<policy>/<reward>/<point>/seed<s>/, its log and timing under ablation/ too, and its
    spec is the ablations' variant with the point's k / tau / S."""
    import shlex

    import pandas as pd

    out, jobs = _dry_run_train_jobs(tmp_path, {})
    cfg = load_config(REPO / "config/smoke.yaml")
    a = cfg["experiments"]["ablations"]
    grid = pd.read_csv(REPO / a["table"], sep="\t")
    points = {}
    for job in jobs:
        m = re.search(r"^\s+output: results/smoke/ablation/([^/]+)/([^/]+)/([^/]+)/seed(\d+)/summary.json", job, re.M)
        if not m:
            continue
        policy, reward, point, seed = m.groups()
        run = f"{policy}/{reward}/{point}/seed{seed}"
        assert f"log: logs/smoke/ablation/{run}.log" in job, job
        assert f"benchmark: timings/smoke/ablation/{run}.tsv" in job, job
        words = shlex.split(job.split("Shell command: ", 1)[1])
        variant = json.loads(words[words.index("--spec-json") + 1])["variant"]
        points[(point, int(seed))] = (policy, reward, variant)
    expected = {
        ("_".join(f"{k}~{v}" for k, v in row.items()), s): row for row in grid.to_dict("records") for s in a["seeds"]
    }
    assert set(points) == set(expected)
    for key, (policy, reward, variant) in points.items():
        assert (policy, reward, variant["name"]) == (a["policy"], a["reward"], a["variant"])
        assert {k: variant[k] for k in grid.columns} == expected[key]


def test_train_nodes_start_torchrun_on_each_node_and_ask_slurm_for_the_nodes(tmp_path):
    """train_nodes: 2 x train_processes: 2 on cuda: the train rules go through the launcher's SLURM path (srun, one
    torchrun per node, rendezvous port from the config) and ask for 2 nodes, 2 tasks and 2 GPUs per node."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.utils import set_gres_string

    _, jobs = _dry_run_train_jobs(
        tmp_path,
        {
            "device": "cuda",
            "train_processes": 2,
            "train_nodes": 2,
            "train_port": 29600,
            "threads": 3,
            "slurm": {"train": {"runtime": 90}},
            "grpo": {"batch_prompts": 4, "group_size": 2, "mask_steps": 2, "diffusion_steps": 2},
        },
    )
    for job in jobs:
        assert "Shell command: python -m margrpo.infra.launch --nodes 2 --port 29600 2 margrpo train " in job, job
        # each node's task: its processes' threads; the time from the config, the memory its default
        assert re.search(r"\bcpus_per_task=6\b", job) and re.search(r"\bruntime=90\b", job), job
        assert re.search(r"\bmem_mb=80000\b", job), job
        assert (
            re.search(r"resources: .*\bnodes=2\b", job) and re.search(r"\btasks=2\b", job) and "gres=gpu:2" in job
        ), job
    resources = SimpleNamespace(gres="gpu:2", get={"gres": "gpu:2"}.get)
    assert (
        set_gres_string(SimpleNamespace(resources=resources)).strip() == "--gres=gpu:2"
    )  # per node, as SLURM counts it


def test_train_processes_launch_n_local_processes_and_request_one_gpu_each(tmp_path):
    """train_processes: 2 on cuda: the train rules run 2 processes (margrpo.infra.launch), ask Snakemake for 2 GPUs
    (which the SLURM executor turns into --gpus=2) and 2 x threads cores; one process stays a plain command."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.utils import set_gres_string

    out, jobs = _dry_run_train_jobs(
        tmp_path,
        {
            "device": "cuda",
            "train_processes": 2,
            "threads": 3,
            "grpo": {"batch_prompts": 2, "group_size": 2, "mask_steps": 2, "diffusion_steps": 2},
        },
    )
    for job in jobs:
        assert "Shell command: python -m margrpo.infra.launch 2 margrpo train " in job, job
        assert re.search(r"resources: .*\bgpu=2\b", job) and re.search(r"^\s*threads: 6$", job, re.M), job
        assert re.search(r"\bcpus_per_task=6\b", job), job  # SLURM's CPUs: the processes' threads
        assert "--threads 3 " in job  # per process
    others = [j for j in out.split("\n\n") if re.search(r"^rule (sample|pretrain):", j, re.M)]
    assert others and all("margrpo.infra.launch" not in j and re.search(r"gpu=1\b", j) for j in others)
    assert set_gres_string(SimpleNamespace(resources=SimpleNamespace(get={"gpu": 2}.get))).strip() == "--gpus=2"
    single = subprocess.run(
        [
            SNAKEMAKE,
            "-n",
            "-p",
            "--cores",
            "8",
            "--resources",
            "gpu=8",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(REPO / "config/smoke.yaml"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert (
        single.returncode == 0
        and "margrpo.infra.launch" not in single.stdout
        and "Shell command: margrpo train " in single.stdout
    )


def test_every_stage_with_a_precision_option_runs_at_the_configs_precision(tmp_path):
    """`mixed_precision` reaches every stage that autocasts a policy (the option with the schema's choices; the
    scorers' training has its own fp32 | bf16 switch): the sample rule once ran without `--precision` and so
    sampled the evaluation in the stage's default bf16 while the config trained in fp32 (3.5x the CPU time, and
    images from other numerics than the validations')."""
    import shlex

    from margrpo.cli import build_parser

    out, _ = _dry_run_train_jobs(tmp_path, {"toy_weights": "train"})
    precision = load_config(REPO / "config/smoke.yaml")["mixed_precision"]
    checked = set()
    for job in out.split("\n\n"):
        if "Shell command: " not in job:
            continue
        words = shlex.split(job.split("Shell command: ", 1)[1].split(">", 1)[0])
        if "margrpo" not in words:
            continue
        stage = words[words.index("margrpo") + 1]
        option = (
            build_parser(stage)._subparsers._group_actions[0].choices[stage]._option_string_actions.get("--precision")
        )
        if option is not None and list(option.choices) == ["no", "bf16", "fp16"]:
            assert "--precision" in words and words[words.index("--precision") + 1] == precision, job
            checked.add(stage)
    assert {"sample", "pretrain", "warmup"} <= checked


def test_the_second_seed_set_trains_the_variants_it_names(tmp_path):
    """`replicate_variants` (issue 43): the second seed set trains only those variants; the first set all of them."""
    out, jobs = _dry_run_train_jobs(tmp_path, {"experiments": {"ladder": {"replicate_variants": ["fix", "sim"]}}})
    ladder = load_config(REPO / "config/smoke.yaml")["experiments"]["ladder"]
    trained = set(
        re.findall(r"^\s+output: results/smoke/train/toy-nova/toypref/(\w+)/seed(\d+)/summary.json", out, re.M)
    )
    expected = {(v, str(s)) for v in ladder["variants"] for s in ladder["seeds"]}
    assert trained == expected | {(v, str(s)) for v in ("fix", "sim") for s in ladder["replicate_seeds"]}


def test_a_train_job_asks_for_its_processes_threads_and_carries_slurm_conf(monkeypatch):
    """cpus_per_task = processes x threads in every geometry; SLURM_CONF, which the jobstep plugin strips from the
    job's environment, rides in the command where the submitting shell sets it."""
    from margrpo.infra.slurm import train_job

    monkeypatch.setenv("SLURM_CONF", "/etc/site slurm/slurm.conf")
    for processes, nodes in ((1, 1), (2, 1), (2, 2)):
        job = train_job(processes, nodes, True, threads=3)
        assert job.launch.startswith("SLURM_CONF='/etc/site slurm/slurm.conf' "), job.launch
        assert job.resources["cpus_per_task"] == processes * 3, job.resources
    monkeypatch.delenv("SLURM_CONF")
    assert train_job(1, 1, True).launch == "margrpo"


def test_job_end_time_logs_the_limit_it_reads_or_why_it_has_none(monkeypatch, caplog):
    """It turned every failure into "no limit" silently, so a run's guard could vanish unseen (issue 61.5)."""
    import subprocess
    from datetime import datetime

    from margrpo.infra import slurm

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    record = {"EndTime": "2030-01-02T03:04:05"}
    monkeypatch.setattr(slurm, "job_record", lambda job_id: record)
    with caplog.at_level("INFO", logger="margrpo.infra.slurm"):
        assert slurm.job_end_time() == datetime(2030, 1, 2, 3, 4, 5).timestamp()
        assert "SLURM job 42 ends at 2030-01-02T03:04:05" in caplog.text
        record["EndTime"] = "Unknown"
        assert slurm.job_end_time() is None and "no time limit (EndTime Unknown)" in caplog.text

        def scontrol_fails(job_id):
            raise subprocess.CalledProcessError(1, ["scontrol", "show", "job"])

        monkeypatch.setattr(slurm, "job_record", scontrol_fails)
        assert slurm.job_end_time() is None and "its time limit cannot be read" in caplog.text
        caplog.clear()
        monkeypatch.delenv("SLURM_JOB_ID")
        assert slurm.job_end_time() is None and not caplog.text  # outside SLURM: nothing to say


def test_a_planned_stop_requeues_the_job_at_most_its_bound_and_never_one_slurm_is_ending(monkeypatch, caplog):
    """infra.slurm.requeue (issue 61.1): `scontrol requeue <own id>` where the job runs and has been requeued fewer
    than `limit` times; otherwise the job ends resumable (status 75). The test cluster runs it for real."""
    import subprocess

    from margrpo.infra import slurm

    calls, record = [], {"JobState": "RUNNING", "Restarts": "0"}
    monkeypatch.setattr(slurm, "job_record", lambda job_id: record)

    def scontrol(*args):
        calls.append(args)
        if record.get("refuse"):
            raise subprocess.CalledProcessError(1, ["scontrol", *args], stderr="Requested operation not supported")
        return ""

    monkeypatch.setattr(slurm, "_scontrol", scontrol)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert slurm.requeue(20) is False and calls == []  # outside SLURM
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert slurm.requeue(0) is False and calls == []  # slurm.requeues: 0
    assert slurm.requeue(2) is True and calls == [("requeue", "7")]
    assert "SLURM job 7 requeued (1 of at most 2)" in caplog.text
    record["Restarts"] = "2"
    assert slurm.requeue(2) is False and len(calls) == 1 and "requeued 2 times already" in caplog.text
    record.update(Restarts="0", JobState="COMPLETING")  # SLURM requeues or ends it already
    assert slurm.requeue(2) is False and len(calls) == 1
    record.update(JobState="RUNNING", refuse=True)
    assert slurm.requeue(2) is False and "cannot requeue it (Requested operation not supported)" in caplog.text
