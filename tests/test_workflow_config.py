"""The Snakemake skeleton: every config dry-runs to the full DAG; bad configs name the key path.

Dry-runs work in a scratch directory (tests/dry_runs.py), so results a `make run` left in the checkout change nothing.
The train jobs those dry-runs plan: test_workflow_jobs.py.
"""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dry_runs import REAL_STAGES, REPO, SHIPPED_STAGES, SNAKEMAKE, TOY_STAGES, dry_run

from margrpo.experiment.config import ConfigError, load_config, shared_dirs, train_spec

BANNER = "Using workflow specific profile"


@pytest.mark.parametrize(
    "configfile,stages",
    [
        (None, SHIPPED_STAGES),
        ("config/smoke.yaml", TOY_STAGES),
        ("config/full.yaml", SHIPPED_STAGES),
        ("config/paper-nova.yaml", REAL_STAGES),
        ("config/paper-harmon.yaml", REAL_STAGES | {"warmup"}),
    ],
)
def test_dry_run_builds_full_dag(configfile, stages, tmp_path):
    jobs = dry_run(tmp_path, *(["--configfile", str(REPO / configfile)] if configfile else []))
    assert stages <= set(jobs), f"missing stages: {stages - set(jobs)}"
    assert jobs["all"] == 1


def test_default_ladder_has_three_seeds_per_variant(tmp_path):
    jobs = dry_run(tmp_path)
    cfg = load_config(REPO / "config/config.yaml")
    ladder = cfg["experiments"]["ladder"]
    assert len(ladder["seeds"]) >= 3
    assert jobs["train"] >= len(ladder["variants"]) * len(ladder["seeds"])


def test_lint_is_clean():
    out = subprocess.run([SNAKEMAKE, "--lint"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and "Congratulations" in out.stdout + out.stderr, out.stdout + out.stderr


VARIANTS = {"grpo": {}, "fix": {"freeze_head": True}, "mte": {"trajectories": 4}, "sim": {"sim": True}}


def with_variant(name, **settings):
    return {"variants": {**VARIANTS, name: settings}}


@pytest.mark.parametrize(
    "delta,key,message",
    [
        ({"grpo": {"stepz": 3}}, "grpo.stepz", "unknown key"),
        ({"grpo": {"steps": "ten"}}, "grpo.steps", "not of type"),
        ({"policies": {"p": {"kind": "toy", "pretrain": {"lr": -1}}}}, "policies.p.pretrain.lr", "minimum"),
        ({"variants": {"grpo": {"kl": "paper"}}}, "variants.grpo.kl", "unknown key"),
        ({"experiments": {"ladder": {"policies": ["nope"]}}}, "experiments.ladder.policies", "not defined"),
        # issue 14: each of these passed a dry-run before, then went wrong or failed late
        (with_variant("grpo", overrides={"stepz": 3}), "variants.grpo.overrides.stepz", "unknown key"),
        (with_variant("grpo", overrides={"steps": -5}), "variants.grpo.overrides.steps", "less than the minimum of 1"),
        (
            with_variant("grpo", overrides={"group_size": 1}),
            "variants.grpo.overrides.group_size",
            "less than the minimum of 2",
        ),
        (
            with_variant("grpo", overrides={"micro_batches": 5}),
            "variants.grpo.overrides.micro_batches",
            "do not divide the 12 images",
        ),
        ({"grpo": {"micro_batches": 5}}, "grpo.micro_batches", "do not divide the 12 images"),
        (
            {"train_processes": 2},
            "grpo.batch_prompts",
            "3 prompt groups do not split evenly over the 2 processes (train_processes x train_nodes",
        ),
        (
            {"train_nodes": 2, "train_processes": 2},
            "grpo.batch_prompts",
            "3 prompt groups do not split evenly over the 4 processes",
        ),
        ({"train_processes": 3, "grpo": {"micro_batches": 8}}, "grpo.micro_batches", "do not divide the 4 images"),
        (
            {"policies": {"toy-nova": {"kind": "toy", "model": {"widht": 64}}}},
            "policies.toy-nova.model.widht",
            "unknown key",
        ),
        (
            {"rewards": {"toyclip": {"toyclip": 1.0}, "mixed": {"toyclip": 1.0, "hpsv3": 1.0}}},
            "rewards.mixed.hpsv3",
            "is not one of",
        ),
        ({"evaluation": {"preference": ["toyclip", "hpsv3"]}}, "evaluation.preference.1", "is not one of"),
        ({"reward_models": {"hpsv3": {"path": "x"}}}, "reward_models.hpsv3", "is not one of"),
        (with_variant("sim", sim=True, tau=math.nan), "variants.sim.tau", "not a finite number"),
        ({"experiments": {"ladder": {"seeds": [0, 1, 1]}}}, "experiments.ladder.seeds", "non-unique"),
        # a policy's own GRPO settings are checked like a variant's overrides, and named by their key path
        (
            {"policies": {"toy-nova": {"kind": "toy", "grpo": {"lrr": 0.1}}}},
            "policies.toy-nova.grpo.lrr",
            "unknown key",
        ),
        (
            {"policies": {"toy-nova": {"kind": "toy", "grpo": {"mask_steps": 20}}}},
            "policies.toy-nova.grpo.mask_steps",
            "exceeds policies.toy-nova.sampling.ar_steps = 16",
        ),
        # the climbing ladder: a control that shuffles its advantages, in blocks of its own
        (
            {
                "experiments": {
                    "climb": {
                        "enabled": True,
                        "policies": ["toy-nova"],
                        "rewards": ["toyclip"],
                        "variants": ["grpo", "fix"],
                        "control": "fix",
                    }
                }
            },
            "experiments.climb.control",
            "advantages as they are",
        ),
        (
            {
                "experiments": {
                    "climb": {
                        "enabled": True,
                        "policies": ["toy-nova"],
                        "rewards": ["toyclip"],
                        "variants": ["grpo"],
                        "control": "control",
                    }
                }
            },
            "experiments.climb.control",
            "is not one of experiments.climb.variants",
        ),
        (
            {"experiments": {"climb": {"enabled": True, "policies": ["toy-nova"], "rewards": ["toyclip"]}}},
            "experiments.climb",
            "also the ladder's",
        ),
        ({"experiments": {"table1": {"seeds": []}}}, "experiments.table1.seeds", "non-empty"),
        ({"experiments": {"ladder": {"variants": []}}}, "experiments.ladder.variants", "non-empty"),
        ({"experiments": {"ablations": {"seeds": [0, 0]}}}, "experiments.ablations.seeds", "non-unique"),
        (
            {
                "toyclip": {"enabled": False},
                "rewards": {"shapes": {"shapes": 1.0}},
                "experiments": {
                    "ladder": {"rewards": ["shapes"]},
                    "table1": {"rewards": ["shapes"]},
                    "ablations": {"reward": "shapes"},
                },
            },
            "evaluation.preference",
            "toyclip scorer is disabled",
        ),
    ],
)
def test_bad_config_names_key_path(delta, key, message):
    with pytest.raises(ConfigError, match=re.escape(f"'{key}'") + ".*" + re.escape(message)):
        load_config(delta)


@pytest.mark.parametrize(
    "table,message",
    [
        ("topfrac\ttau\ttrajectories\n0.3\t0.0\t4\n", "unknown: ['topfrac']"),  # used to train every point at k = 0.3
        ("top_frac\ttau\n1.5\t0.0\n", "key 'top_frac': 1.5 is greater than the maximum of 1"),
        ("top_frac\ttau\n0.3\tnan\n", "key 'tau': nan is not a finite number"),
        ("top_frac\ttrajectories\n0.3\t2.5\n", "invalid literal for int()"),
        ("top_frac\n0.3\n0.3\n", ":3 repeats line 2"),
        ("top_frac\n", "no grid points"),
    ],
)
def test_bad_ablation_table_names_the_file(tmp_path, table, message):
    (tmp_path / "grid.tsv").write_text(table)
    with pytest.raises(ConfigError, match=re.escape("'experiments.ablations.table'") + ".*" + re.escape(message)):
        load_config({"experiments": {"ablations": {"table": str(tmp_path / "grid.tsv")}}})


@pytest.mark.parametrize(
    "edit,named",
    [
        (lambda c: c["grpo"].update(clip_epsilon=0.2), "grpo.clip_epsilon"),
        (lambda c: c["variants"]["grpo"].update(overrides={"steps": -5}), "variants.grpo.overrides.steps"),
        (lambda c: c["policies"]["toy-nova"]["model"].update(widht=64), "policies.toy-nova.model.widht"),
    ],
)
def test_snakemake_rejects_a_bad_config_at_dry_run_with_the_key_path(tmp_path, edit, named):
    cfg = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    edit(cfg)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--configfile", str(bad), "--directory", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert named in out.stdout + out.stderr, out.stderr[-2000:]


def test_the_default_profile_loads_for_make_run_and_a_bare_snakemake(tmp_path):
    """Snakemake finds profiles/default beside the Snakefile (a link to workflow/profiles/): rerun-incomplete,
    show-failed-logs and the gpu cap are on for `make run` and for `snakemake --cores all` typed by hand."""
    bare = subprocess.run(
        [SNAKEMAKE, "-n", "--cores", "all", "--directory", str(tmp_path)], cwd=REPO, capture_output=True, text=True
    )
    assert bare.returncode == 0 and BANNER in bare.stderr, bare.stderr[-2000:]
    elsewhere = subprocess.run(
        [SNAKEMAKE, "-n", "--snakefile", str(REPO / "Snakefile"), "--directory", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert elsewhere.returncode == 0 and BANNER in elsewhere.stderr, elsewhere.stderr[-2000:]
    if not (REPO / ".venv/bin/snakemake").exists():
        pytest.skip("make run needs the repository's .venv (make install)")
    make = subprocess.run(
        ["make", "-s", "-o", ".venv/.installed", "run", f"SNAKEMAKE_ARGS=-n --directory {tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert make.returncode == 0 and BANNER in make.stderr, make.stdout[-2000:] + make.stderr[-2000:]
    profile = yaml.safe_load((REPO / "profiles/default/config.yaml").read_text())
    assert profile["rerun-incomplete"] and profile["show-failed-logs"] and profile["resources"]["gpu"] == 1


def test_a_failing_rule_shows_its_log(tmp_path):
    """show-failed-logs (from the default profile): the error is in snakemake's own output, not only in the log."""
    cfg = yaml.safe_load((REPO / "config/smoke.yaml").read_text())
    empty = tmp_path / "nova-weights"
    empty.mkdir()
    cfg["policies"]["nova"] = {"kind": "nova", "path": str(empty)}
    config = tmp_path / "nova.yaml"
    config.write_text(yaml.safe_dump(cfg))
    target = f"{shared_dirs(load_config(config))['base']['nova']}/policy.json"
    out = subprocess.run(
        [
            SNAKEMAKE,
            target,
            "--cores",
            "1",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
            "--configfile",
            str(config),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"),
    )
    assert out.returncode != 0
    assert "margrpo check-weights: error: nova weights in" in out.stdout + out.stderr, out.stderr[-3000:]
    assert "missing model_index.json" in out.stdout + out.stderr and "Traceback" not in out.stdout + out.stderr


def test_shared_stage_folders_are_keyed_by_exactly_what_they_read():
    """data / toyclip / pretrain / warmup folders: equal settings share a folder, any change they read moves it."""
    base = load_config(REPO / "config/smoke.yaml")
    dirs = shared_dirs(base)
    assert re.fullmatch(r"results/pretrain/toy-nova-[0-9a-f]{8}", dirs["base"]["toy-nova"])
    assert (
        shared_dirs(load_config(REPO / "config/full.yaml"))["base"]
        == shared_dirs(load_config(REPO / "config/config.yaml"))["base"]
    )

    def moved(edit):
        cfg = load_config(REPO / "config/smoke.yaml")
        edit(cfg)
        new = shared_dirs(cfg)
        return {k for k in ("data", "toyclip") if new[k] != dirs[k]} | {
            f"{k}/{p}" for k in ("base", "warmup") for p in dirs[k] if new[k][p] != dirs[k][p]
        }

    assert moved(lambda c: c.update(name="other", report={"formats": ["svg"]})) == set()
    assert moved(lambda c: c["grpo"].update(lr=0.5)) == set()  # RL settings: no shared stage reads them
    assert moved(lambda c: c["policies"]["toy-nova"]["pretrain"].update(steps=11)) == {"base/toy-nova"}
    assert moved(lambda c: c["policies"]["toy-harmon"]["warmup"].update(lr=0.1)) == {"warmup/toy-harmon"}
    assert moved(lambda c: c["toyclip"].update(width=16)) == {"toyclip"}
    assert moved(lambda c: c["prompts"].update(n_eval=13)) == {
        "data",
        "toyclip",
        "base/toy-nova",
        "base/toy-harmon",
        "base/toy-micro",
        "warmup/toy-harmon",
    }
    assert moved(lambda c: c.update(mixed_precision="bf16")) == {
        "base/toy-nova",
        "base/toy-harmon",
        "base/toy-micro",
        "warmup/toy-harmon",
    }


def test_stage_json_arguments_are_validated_without_a_traceback(tmp_path):
    """`margrpo pretrain` with steps: -5 used to exit 0 with an untrained policy."""
    policy = {"kind": "toy", "pretrain": {"steps": -5}}
    out = subprocess.run(
        [
            str(Path(sys.executable).with_name("margrpo")),
            "pretrain",
            "--world",
            "w.json",
            "--eval-suite",
            "e.jsonl",
            "--policy-json",
            json.dumps(policy),
            "--out-dir",
            str(tmp_path / "p"),
            "--quality",
            str(tmp_path / "q.json"),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="0"),
    )
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        == "margrpo pretrain: error: --policy-json: key 'pretrain.steps': -5 is less than the minimum of 1"
    )


def test_unknown_names_in_stage_arguments_are_one_line_errors(tmp_path):
    from margrpo.cli import main

    common = [
        "--policy-dir",
        "p",
        "--suites-dir",
        "s",
        "--out-dir",
        str(tmp_path),
        "--config",
        str(REPO / "config/smoke.yaml"),
    ]
    for flag, value, kind in (
        ("--policy", "nope", "policies"),
        ("--reward", "hpsv3", "rewards"),
        ("--variant", "grpo-x", "variants"),
    ):
        names = {"--policy": "toy-nova", "--reward": "toyclip", "--variant": "grpo", flag: value}
        with pytest.raises(SystemExit, match=re.escape(f"key '{flag}': {value!r} is not defined under '{kind}'")):
            main(["train", *common, *[x for kv in names.items() for x in kv]])


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
    assert spec["policy"]["frozen"] == ["llm.", "proj_in.", "proj_out."] and "frozen" not in spec["grpo"]
    toy = load_config(REPO / "config/config.yaml")
    assert "policy" not in train_spec(toy, "toy-nova", "toypref", "fix")


def test_a_policys_grpo_settings_sit_between_grpo_and_the_variants_overrides():
    """The climbing ladder's base trains with its own GRPO settings (policies.toy-micro.grpo); a variant's overrides
    still win, and the other policies' run specs do not change."""
    cfg = load_config(REPO / "config/config.yaml")
    micro = train_spec(cfg, "toy-micro", "redness", "control")["grpo"]
    assert (micro["lr"], micro["mask_steps"], micro["steps"], micro["advantages"]) == (0.001, 4, 36, "shuffled")
    without = load_config(
        {
            **cfg,
            "policies": {k: v for k, v in cfg["policies"].items() if k != "toy-micro"},
            "experiments": {**cfg["experiments"], "climb": {"enabled": False}},
        }
    )
    assert train_spec(cfg, "toy-nova", "toypref", "fix") == train_spec(without, "toy-nova", "toypref", "fix")


def test_schema_defaults_are_the_dataclass_defaults():
    """One source of defaults: every schema default equals the field default of the dataclass it builds
    (GRPOConfig for grpo and the variant switches, SamplingConfig, ToyMARConfig, PretrainConfig), and
    every schema key is a field; the toyclip stage takes its defaults from the schema itself."""
    import dataclasses

    from margrpo.experiment.config import schema_section
    from margrpo.grpo.rollout import SamplingConfig
    from margrpo.grpo.trainer import GRPOConfig
    from margrpo.policy import ToyMARConfig
    from margrpo.stages.train_toyclip import CONFIG_DEFAULTS
    from margrpo.toylab.pretraining import PretrainConfig

    def defaults(cls):
        return {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)
        }

    def schema(section, skip=()):
        return {k: v["default"] for k, v in schema_section(section)["properties"].items() if k not in skip}

    for section, cls, skip in (
        ("grpo", GRPOConfig, ()),
        ("variants.*", GRPOConfig, ("report_step", "overrides")),
        ("policies.*.sampling", SamplingConfig, ()),
        ("policies.*.model", ToyMARConfig, ()),
        ("policies.*.pretrain", PretrainConfig, ()),
    ):
        fields = defaults(cls)
        for key, value in schema(section, skip).items():
            assert key in fields, f"{section}.{key} is no field of {cls.__name__}"
            expected = list(fields[key]) if isinstance(fields[key], tuple) else fields[key]
            assert value == expected, (
                f"{section}.{key}: schema default {value!r}, {cls.__name__}.{key} = {fields[key]!r}"
            )
    assert CONFIG_DEFAULTS == schema("toyclip")


def test_schema_scorer_names_are_the_registry():
    from margrpo.experiment.config import load_schema
    from margrpo.rewards import available_rewards

    assert sorted(load_schema()["$defs"]["scorer"]["enum"]) == available_rewards()
