"""The Snakemake skeleton: every config dry-runs to the full DAG; bad configs name the key path.

Dry-runs work in a scratch directory, so results a `make run` left in the checkout change nothing.
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

from margrpo.experiment.config import ConfigError, load_config, shared_dirs, train_spec

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
BANNER = "Using workflow specific profile"

# DESIGN sections 3-4: every stage of the experiment must be in the DAG.
TOY_STAGES = {
    "make_suites",
    "train_toyclip",
    "pretrain",
    "warmup",
    "train",  # the ladder and the Fig. 7 grid (test_ablation_points_are_train_jobs_under_ablation)
    "select_checkpoint",
    "sample",
    "eval_compbench",
    "eval_preference",
    "uncertainty_maps",
    "table1",
    "table2",
    "fig2_dynamics",
    "fig4_uncertainty",
    "fig6_samples",
    "fig7a_samples",
    "fig7b_reward_curves",
    "fig7c_final_metric",
}
REAL_STAGES = (TOY_STAGES - {"train_toyclip", "pretrain", "warmup"}) | {"check_weights"}
# the configs whose toy stages the package's release ships (toy_weights: shipped): placed, not trained
SHIPPED_STAGES = (TOY_STAGES - {"train_toyclip", "pretrain"}) | {"place_toyclip", "place_toypref", "place_pretrained"}


def dry_run(workdir, *args):
    """Job counts of a dry-run of the repository's Snakefile in `workdir` (a scratch directory)."""
    out = subprocess.run(
        [SNAKEMAKE, "-n", "--cores", "1", "--snakefile", str(REPO / "Snakefile"), "--directory", str(workdir), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout + out.stderr
    table = text.split("Job stats:", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


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
        "warmup/toy-harmon",
    }
    assert moved(lambda c: c.update(mixed_precision="bf16")) == {
        "base/toy-nova",
        "base/toy-harmon",
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
        assert re.search(r"\bmem_mb=96000\b", job), job
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
