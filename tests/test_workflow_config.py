"""The Snakemake skeleton: every config dry-runs to the full DAG; bad configs name the key path."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from margrpo.config import ConfigError, load_config, train_spec

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))

# DESIGN sections 3-4: every stage of the experiment must be in the DAG.
TOY_STAGES = {"make_suites", "train_toyclip", "pretrain", "warmup", "train", "train_ablation", "select_checkpoint",
              "sample", "eval_compbench", "eval_preference", "uncertainty_maps", "table1", "table2", "fig2_dynamics",
              "fig4_uncertainty", "fig6_samples", "fig7a_samples", "fig7b_reward_curves", "fig7c_final_metric"}
REAL_STAGES = (TOY_STAGES - {"train_toyclip", "pretrain", "warmup"}) | {"check_weights"}


def dry_run(*args, cwd=REPO):
    out = subprocess.run([SNAKEMAKE, "-n", "--cores", "1", *args], cwd=cwd, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    table = text.split("Job stats:", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.mark.parametrize("configfile,stages", [
    (None, TOY_STAGES),
    ("config/smoke.yaml", TOY_STAGES),
    ("config/full.yaml", TOY_STAGES),
    ("config/paper-nova.yaml", REAL_STAGES),
    ("config/paper-harmon.yaml", REAL_STAGES | {"warmup"}),
])
def test_dry_run_builds_full_dag(configfile, stages):
    jobs = dry_run(*(["--configfile", configfile] if configfile else []))
    assert stages <= set(jobs), f"missing stages: {stages - set(jobs)}"
    assert jobs["all"] == 1


def test_default_ladder_has_three_seeds_per_variant():
    jobs = dry_run()
    cfg = load_config(REPO / "config/config.yaml")
    ladder = cfg["experiments"]["ladder"]
    assert len(ladder["seeds"]) >= 3
    assert jobs["train"] >= len(ladder["variants"]) * len(ladder["seeds"])


def test_lint_is_clean():
    out = subprocess.run([SNAKEMAKE, "--lint"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and "Congratulations" in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("delta,key", [
    ({"grpo": {"stepz": 3}}, "grpo.stepz"),
    ({"grpo": {"steps": "ten"}}, "grpo.steps"),
    ({"policies": {"p": {"kind": "toy", "pretrain": {"lr": -1}}}}, "policies.p.pretrain.lr"),
    ({"variants": {"grpo": {"kl": "paper"}}}, "variants.grpo.kl"),
    ({"experiments": {"ladder": {"policies": ["nope"]}}}, "experiments.ladder.policies"),
])
def test_bad_config_names_key_path(delta, key):
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'")):
        load_config(delta)


def test_snakemake_rejects_unknown_key_with_path(tmp_path):
    cfg = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    cfg["grpo"]["clip_epsilon"] = 0.2
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([SNAKEMAKE, "-n", "--configfile", str(bad)], cwd=REPO, capture_output=True, text=True)
    assert out.returncode != 0
    assert "clip_epsilon" in out.stdout + out.stderr


def test_every_config_is_valid():
    for path in sorted((REPO / "config").glob("*.yaml")):
        load_config(path)


def test_defaults_fill_and_do_not_mutate_input():
    delta = {"grpo": {"steps": 7}}
    cfg = load_config(delta)
    assert delta == {"grpo": {"steps": 7}}
    assert cfg["grpo"]["steps"] == 7 and cfg["grpo"]["mask_steps"] == 12 and cfg["grpo"]["beta"] == 0.01


def test_rl_frozen_reaches_the_run_spec_only_where_set():
    """paper-harmon trains mar.* alone (MAR-GRPO's Harmon runs); the toy runs' specs do not change."""
    harmon = load_config(REPO / "config/paper-harmon.yaml")
    spec = train_spec(harmon, "harmon", "hps", "sim")
    assert spec["grpo"]["frozen"] == ["llm.", "proj_in.", "proj_out."]
    toy = load_config(REPO / "config/config.yaml")
    assert "frozen" not in train_spec(toy, "toy-nova", "toyclip", "fix")["grpo"]
