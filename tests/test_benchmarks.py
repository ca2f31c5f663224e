"""The benchmark scripts run end to end on tiny random policies (CPU): every row they promise, with sane numbers."""

import csv
import json
import math
import os
import subprocess
import sys

import pytest


def test_real_scale_tiny_reports_every_policy_and_variant(repo, tmp_path):
    out = tmp_path / "tmp.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [
            sys.executable,
            str(repo / "benchmarks/real_scale.py"),
            "--tiny",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {(r["policy"], r["variant"]): r for r in report["rows"]}
    assert set(rows) == {(p, v) for p in ("nova", "harmon") for v in ("grpo", "fix", "mte", "sim", "committed")}
    assert report["device"].startswith("cpu") and report["matmul_tflops"] > 0
    for key, r in rows.items():
        for field in ("s_per_step", "images_per_s", "fraction"):
            assert math.isfinite(r[field]) and r[field] > 0, (key, field, r[field])
        assert r["peak_mem_mb"] > 0 and r["gradient_checkpointing"] == "off"
        assert any(line.split()[:2] == list(key) for line in run.stdout.splitlines())  # the table has the row too
    # the trainer with every block checkpointed: Harmon's MAR-H (dropout 0.1) used to be recomputed in train mode
    run = subprocess.run(
        [
            sys.executable,
            str(repo / "benchmarks/real_scale.py"),
            "--tiny",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--policies",
            "harmon,nova",
            "--variants",
            "fix",
            "--gradient-checkpointing",
            "--out",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert [r["gradient_checkpointing"] for r in json.loads(out.read_text())["rows"]] == ["on", "on"]


def test_real_scale_resets_the_policy_it_reuses_to_a_fresh_build(repo):
    """Each policy is built once; a later variant gets it back with the fresh build's weights, all trainable."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("real_scale", repo / "benchmarks/real_scale.py")
    real_scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_scale)
    cpu = torch.device("cpu")
    policy, _ = real_scale.initial_policy("harmon", True, cpu, False)
    with torch.no_grad():  # what a variant's training leaves behind: changed weights, frozen parts
        for p in policy.parameters():
            p.add_(1.0)
    policy.llm.requires_grad_(False)
    again, _ = real_scale.initial_policy("harmon", True, cpu, False)
    fresh = real_scale.build_policy("harmon", True, cpu).state_dict()
    assert again is policy and all(p.requires_grad for p in again.parameters()) and again.training
    assert all(torch.equal(v, fresh[k]) for k, v in again.state_dict().items())


def test_gradient_signal_runs_on_a_tiny_policy(repo, tmp_path):
    """benchmarks/gradient_signal.py --test: batch gradients, their cosines and the reward along each direction; the
    exact (pathwise) gradient of the expected reward agrees with a finite difference of the same common-random-number
    reward, along the gradient and along a random direction, and its column of cosines is printed (issue 53)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, str(repo / "benchmarks/gradient_signal.py"), "--test"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "pairwise cos of batch gradients" in out and "expected reward at the base" in out
    changes = [line for line in out.splitlines() if "reward change" in line]
    assert len(changes) == 4  # descent, ascent, Adam's sign step, random; one eta each
    for line in changes:
        value = float(line.split("reward change")[1].split()[0])
        assert math.isfinite(value)
    # the step's direction part (descent - ascent) / 2 and curvature part (descent + ascent) / 2, per eta
    (split_line,) = [line for line in out.splitlines() if "direction part" in line]
    down, up = (float(changes[i].split("reward change")[1].split()[0]) for i in (0, 1))
    direction = float(split_line.split("direction part")[1].split()[0])
    curvature = float(split_line.split("curvature part")[1].split()[0])
    assert abs(direction - (down - up) / 2) <= 1e-4 and abs(curvature - (down + up) / 2) <= 1e-4, split_line
    checks = [line for line in out.splitlines() if line.startswith("finite difference along")]
    assert len(checks) == 2  # the gradient's own direction and a random one
    for line in checks:
        fd, exact = (float(part.rsplit(":", 1)[1]) for part in line.split(";"))
        assert fd != 0 and abs(fd - exact) <= 0.02 * abs(fd), line  # measured: 1e-4 and 5e-4 relative
    split = float(out.split("|sum of the")[1].split("|exact|")[1].split()[0])
    assert split < 1e-5  # the per-AR-step parts (GRPO's weighting of them) add up to the exact gradient
    half = float(out.split("cos between the halves")[1].split()[0])
    assert -1 <= half <= 1
    column = [line for line in out.splitlines() if "exact gradient):" in line]
    assert len(column) == 2  # --test's groups: 1 and 3 batches
    for line in column:
        assert math.isfinite(float(line.split("exact gradient):")[1].split()[0]))


def test_climb_settings_prints_each_points_lift_over_the_control(repo, tmp_path):
    """benchmarks/climb_settings.py --test: each sweep point trains the rung and its shuffled control per seed through
    the trainer's run loop and writes one row: the lift, its s.e. and range over seeds, the CPU of a run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "sweep.csv"
    run = subprocess.run(
        [sys.executable, str(repo / "benchmarks/climb_settings.py"), "--test", "--csv", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    assert [(r["sweep"], r["point"]) for r in rows] == [
        ("lr", "lr 0.0003"), ("lr", "lr 0.001"), ("lr", "lr 0.003"),
        ("clip", "clip 0.05"), ("clip", "clip 0.2"), ("clip", "clip None"),
    ]  # fmt: skip
    for r in rows:
        per_seed = [float(x) for x in r["per_seed"].split()]
        assert len(per_seed) == 2 and float(r["lift"]) == pytest.approx(sum(per_seed) / 2, abs=1e-4)  # 4 digits
        assert float(r["min"]) <= float(r["lift"]) <= float(r["max"]) and float(r["cpu_s"]) > 0
    assert len({r["lift"] for r in rows if r["sweep"] == "lr"}) == 3  # the learning rate moves the lift
    assert sum(r["point"] in run.stdout for r in rows) == len(rows)


def test_step_profile_splits_a_default_toy_step_into_exclusive_parts(repo, tmp_path):
    """benchmarks/step_profile.py: every phase of a real +Fix step on the default toy, each part timed exclusively
    (nested parts are not counted twice: the remainder left for the step's other Python is not negative)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "profile.json"
    run = subprocess.run(
        [
            sys.executable,
            str(repo / "benchmarks/step_profile.py"),
            "--steps",
            "1",
            "--json",
            str(out),
            "--grpo",
            '{"batch_prompts": 2}',
            "--config",
            str(repo / "config/config.yaml"),
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    parts = report["parts"]
    for key in (
        "rollout/AR transformer",
        "rollout/head",
        "replay/AR transformer",
        "replay/backward, log-densities, loss",
        "optimizer/AdamW",
    ):
        assert parts[key] > 0, key
    assert parts["other/the step's remaining Python"] > -0.01 * report["cpu_s"]
    assert math.isclose(sum(parts.values()), report["cpu_s"], rel_tol=1e-9) and report["images"] == 8
    assert "| rollout | head |" in run.stdout


def test_reward_preprocessing_times_the_real_path_at_one_and_two_threads(repo):
    """benchmarks/reward_preprocessing.py on two small images: a line per thread count, with its share of a step."""
    run = subprocess.run(
        [sys.executable, str(repo / "benchmarks/reward_preprocessing.py"), "--images", "2", "--size", "64"]
        + ["--repeats", "2"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("threads ")]
    assert [line.split(":")[0] for line in lines] == ["threads 1", "threads 2"], run.stdout
    assert all("2 images of 64 px: median" in line and "% of a 20 s step" in line for line in lines), run.stdout


def test_save_stall_tiny_measures_both_saves(repo, tmp_path):
    out = tmp_path / "stall.json"
    run = subprocess.run(
        [sys.executable, str(repo / "benchmarks/save_stall.py"), "--gib", "0.01", "--repeats", "1", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["state_gib"] >= 0.01 and [r["background"] for r in report["rows"]] == [False, True]
    behind = report["rows"][1]
    assert 0 < behind["stall_s"] <= behind["on_disk_s"] and math.isfinite(report["stall_ratio_behind_over_at_once"])
    assert "median stall: at once" in run.stdout


def test_harmon_warmup_runs_the_real_stages_and_reads_their_quality(repo, tmp_path):
    """benchmarks/harmon_warmup.py --cpu: `margrpo pretrain` then `margrpo warmup` of the config's toy-harmon for
    each freeze step (here 3 pre-training and 2 warm-up steps on tiny suites), one row per freeze step printed and
    kept in rows.json, the numbers read from the warm-up's quality report (issue 71 item 3)."""
    from margrpo.cli import main

    data = tmp_path / "data"
    main(
        ["make-suites", "--out-dir", str(data), "--preset", "grid4", "--n-train", "8", "--n-val", "4", "--n-eval", "6"]
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")])}
    command = [
        sys.executable,
        str(repo / "benchmarks/harmon_warmup.py"),
        "--data",
        str(data),
        "--head-steps",
        "0",
        "2",
    ]
    command += ["--steps", "3", "--warmup-steps", "2", "--quality-images", "1", "--jobs", "1", "--cpu"]
    command += ["--config", str(repo / "config/config.yaml"), "--out", str(tmp_path / "sweep")]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    rows = json.loads((tmp_path / "sweep/rows.json").read_text())
    assert [(r["head_steps"], r["steps"]) for r in rows] == [(0, 3), (2, 3)], rows
    for r in rows:
        warm = json.loads((tmp_path / f"sweep/head{r['head_steps']}/warm/quality.json").read_text())
        assert r["after"]["failed"] == warm["no_valid_object"]
        assert r["before"]["strict"] == warm["before_warmup"]["overall"]["strict"]
        shares = [v for q in (r["before"], r["after"]) for v in q.values() if v is not None]  # None: no such prompt
        assert len(shares) >= 6 and all(0 <= v <= 1 for v in shares) and r["pretrain_s"] > 0, r
    printed = [line for line in run.stdout.splitlines() if line.split("|")[0].strip() in ("0", "2")]
    assert len(printed) == 2, run.stdout
