"""Issue 27: config values never reach a shell unquoted, names are safe paths and wildcards, settings that
would run wrong are refused at dry-run naming the key, and an experiment name keeps its own runs.

Dry-runs work in a scratch directory (as in test_workflow_config.py)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from margrpo.experiment.config import ConfigError, load_config, name_pattern, shared_dirs
from margrpo.experiment.record import RECORD, check_experiment, experiment_settings, record_experiment

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SMOKE = (REPO / "config/smoke.yaml").read_text()
PAYLOAD = "$(touch pwned)"


def snakemake(workdir: Path, config_text: str, *args: str) -> subprocess.CompletedProcess:
    config = workdir / "config.yaml"
    config.write_text(config_text)
    return subprocess.run(
        [
            SNAKEMAKE,
            *args,
            "--cores",
            "1",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(workdir),
            "--configfile",
            str(config),
        ],
        cwd=workdir,
        capture_output=True,
        text=True,
        env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}"),
    )


def smoke_with(**sections) -> str:
    """config/smoke.yaml with whole top-level sections replaced (YAML text)."""
    cfg = yaml.safe_load(SMOKE)
    cfg.update(sections)
    return yaml.safe_dump(cfg, sort_keys=False)


def edited(edit) -> str:
    cfg = yaml.safe_load(SMOKE)
    edit(cfg)
    return yaml.safe_dump(cfg, sort_keys=False)


# each of these passed a dry run on main, then ran a payload, failed late as a traceback, or ran wrong
REFUSED = {
    "policy name": (
        edited(lambda c: c["policies"].update({f"x{PAYLOAD}": {"kind": "toy"}})),
        f"policies.x{PAYLOAD}",
        "does not match",
    ),
    "category": (
        edited(
            lambda c: c["prompts"].update(
                source="files", train_file="t.jsonl", eval_dir="d", eval_categories=[f"color{PAYLOAD}"]
            )
        ),
        "prompts.eval_categories.0",
        "is not one of",
    ),
    "reward name": (
        edited(lambda c: c["rewards"].update(my_reward={"toyclip": 1.0})),
        "rewards.my_reward",
        "does not match",
    ),
    "variant name": (edited(lambda c: c["variants"].update({"a;b": {}})), "variants.a;b", "does not match"),
    "experiment name": (edited(lambda c: c.update(name=f"x{PAYLOAD}")), "name", "does not match"),
    "seed": (
        edited(lambda c: c["experiments"]["ladder"].update(seeds=[-1])),
        "experiments.ladder.seeds.0",
        "minimum of 0",
    ),
    "second seed set": (
        edited(lambda c: c["experiments"]["ladder"].update(replicate_seeds=[1, 2])),
        "experiments.ladder.replicate_seeds",
        "[1] also in experiments.ladder.seeds",
    ),
    "second seed set's variants": (
        edited(lambda c: c["experiments"]["ladder"].update(replicate_seeds=[7], replicate_variants=["fix", "gspo"])),
        "experiments.ladder.replicate_variants",
        "['gspo'] not in experiments.ladder.variants",
    ),
    "float integer": (edited(lambda c: c["grpo"].update(steps=2.0)), "grpo.steps", "2.0 is not of type 'integer'"),
    "float integer in a variant": (
        edited(lambda c: c["variants"]["mte"].update(trajectories=2.0)),
        "variants.mte.trajectories",
        "not of type 'integer'",
    ),
    "duplicate key": (
        SMOKE.replace("\ngrpo: {steps: 2,", "\ngrpo: {steps: 2, steps: 3,"),
        "grpo.steps",
        "is given twice",
    ),
    "duplicate section": (SMOKE + "grpo: {steps: 5}\n", "grpo", "is given twice"),
    "max_prompts": (
        edited(lambda c: c["evaluation"].update(max_prompts=-5)),
        "evaluation.max_prompts",
        "less than the minimum of 1",
    ),
    "val_prompts": (
        edited(lambda c: c["grpo"].update(val_prompts=7)),
        "grpo.val_prompts",
        "exceeds the 6 prompts of the validation suite",
    ),
    "n_train with files": (
        edited(lambda c: c["prompts"].update(source="files", train_file="t.jsonl", eval_dir="d")),
        "prompts.n_train",
        "the files source trains on every prompt",
    ),
    "zero rewards": (
        edited(lambda c: c["rewards"].update(mixed={"toyclip": 0.0, "shapes": 0})),
        "rewards.mixed",
        "every weight is zero",
    ),
    "clip_eps": (
        edited(lambda c: c["grpo"].update(clip_eps=-0.2)),
        "grpo.clip_eps",
        "less than or equal to the minimum of 0",
    ),
    "clip_eps override": (
        edited(lambda c: c["variants"]["grpo"].update(overrides={"clip_eps": -0.2})),
        "variants.grpo.overrides.clip_eps",
        "minimum",
    ),
    "report_step past the end": (
        edited(lambda c: c["variants"]["mte"].update(report_step=3)),
        "variants.mte.report_step",
        "past the run's last step",
    ),
    "report_step no checkpoint": (
        edited(lambda c: (c["grpo"].update(steps=4, save_every=2), c["variants"]["mte"].update(report_step=3))),
        "variants.mte.report_step",
        "no checkpoint at step 3",
    ),
    "ar_steps": (
        edited(lambda c: c["policies"]["toy-nova"]["sampling"].update(ar_steps=17)),
        "policies.toy-nova.sampling.ar_steps",
        "exceeds the 16 tokens",
    ),
    "rl_frozen": (
        edited(lambda c: c["policies"]["toy-nova"].update(rl_frozen=["blocks.0.", "blockz."])),
        "policies.toy-nova.rl_frozen.1",
        "no parameter name of the toy policy starts with 'blockz.'",
    ),
    "lora target": (
        edited(lambda c: c["policies"]["toy-nova"].update(lora={"target_modules": ["qkv", "fc1"]})),
        "policies.toy-nova.lora.target_modules.1",
        "'fc1' names no Linear layer",
    ),
    "yte": ("__use_yte__: true\n" + SMOKE, "__use_yte__", "a YTE template runs code"),
    # issue #31.4: these failed hours later in their own stage
    "n_eval past the world": (
        edited(lambda c: c["prompts"].update(n_eval=10000000)),
        "prompts.n_eval",
        "ask for 1666667 distinct color prompts",
    ),
    "world that cannot be built": (
        edited(lambda c: c.update(world={"grid": 1, "max_objects": 4})),
        "world",
        "exceeds the 1 cells",
    ),
    "related mask model": (
        edited(lambda c: c["experiments"].update(related={"enabled": True, "mask": {"model": {"widht": 64}}})),
        "experiments.related.mask.model",
        "unknown key 'widht'",
    ),
    "related method setting": (
        edited(lambda c: c["experiments"].update(related={"enabled": True, "settings": {"maskgrpo": {"stepz": 2}}})),
        "experiments.related.settings.maskgrpo",
        "unknown key 'stepz'",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_dry_run_refuses_the_setting_naming_its_key(case, tmp_path):
    text, key, message = REFUSED[case]
    out = snakemake(tmp_path, text, "-n")
    shown = out.stdout + out.stderr
    assert out.returncode != 0, shown[-2000:]
    assert re.search(re.escape(f"key '{key}'") + ".*" + re.escape(message), shown), shown[-2000:]
    assert "Traceback" not in shown.split("ConfigError", 1)[-1][-200:]
    assert not list(tmp_path.rglob("pwned"))
    with pytest.raises(
        ConfigError, match=re.escape(f"key '{key}'") + ".*" + re.escape(message)
    ):  # margrpo's own loader too
        load_config(tmp_path / "config.yaml")


def test_names_that_pass_are_the_workflow_wildcards():
    """The schema's name pattern is what common.smk constrains {policy}, {reward} and {variant} to."""
    assert name_pattern() == "[A-Za-z0-9][A-Za-z0-9.-]*"
    assert "name_pattern()" in (REPO / "workflow/rules/common.smk").read_text()
    load_config(
        {"rewards": {"toyclip": {"toyclip": 1.0}, "hps.v2-1": {"toyclip": 1.0, "shapes": -0.5}}}
    )  # dots, dashes, a penalty


def test_good_rl_frozen_and_lora_targets_load(tmp_path):
    load_config(
        yaml.safe_load(
            edited(
                lambda c: c["policies"]["toy-nova"].update(
                    rl_frozen=["blocks.0.", "text_proj."], lora={"target_modules": ["qkv", "attn.proj", "mlp.0"]}
                )
            )
        )
    )


# --- shell quoting -------------------------------------------------------------------------------------
UNQUOTED = {"params.launch", "params.world", "params.command"}  # a command, and make-suites' pre-quoted arguments


def shell_fields():
    """(file, field, quoted) for every {input|output|params|log|wildcards|threads ...} in a shell command."""
    for smk in sorted((REPO / "workflow/rules").glob("*.smk")):
        for line in smk.read_text().splitlines():
            if line.strip().startswith(('"', 'f"')) or "margrpo report" in line:
                for m in re.finditer(r"\{((?:input|output|params|log|wildcards|threads)[\w.\[\]]*)(:q)?\}", line):
                    yield smk.name, m.group(1), bool(m.group(2))


def test_every_value_in_a_shell_command_is_quoted():
    fields = list(shell_fields())
    assert len(fields) > 80 and {"spec", "sampling"} <= {f.split(".")[-1] for _, f, _ in fields}
    unquoted = sorted({f"{smk}: {{{f}}}" for smk, f, q in fields if not q and f not in UNQUOTED})
    assert not unquoted
    common = (REPO / "workflow/rules/common.smk").read_text()
    assert "shlex.quote(','.join(p['eval_categories']))" in common  # the pre-quoted make-suites arguments


def test_a_path_holding_a_payload_reaches_its_command_as_one_argument(tmp_path):
    """A weights path is any string: quoted, `$(...)` and `;` stay characters of the path (the job runs, fails,
    creates nothing)."""
    weights = tmp_path / f"w{PAYLOAD};touch pwned2"
    weights.mkdir()
    cfg = yaml.safe_load(SMOKE)
    cfg["policies"]["nova"] = {"kind": "nova", "path": str(weights)}
    config = tmp_path / "nova.yaml"
    config.write_text(yaml.safe_dump(cfg))
    target = f"{shared_dirs(load_config(config))['base']['nova']}/policy.json"
    out = snakemake(tmp_path, yaml.safe_dump(cfg), target)
    assert out.returncode != 0 and "missing model_index.json" in out.stdout + out.stderr, out.stderr[-3000:]
    assert "pwned" in str(weights) and not [p for p in tmp_path.rglob("pwned*") if p != weights]


# --- one experiment name, one set of settings ------------------------------------------------------------
def test_a_second_config_under_the_same_name_is_refused_at_dry_run(tmp_path):
    """The first run records its settings in results/<name>/; a config with other settings under that name is
    refused at dry run naming `name` and the keys that differ, and nothing of the first run changes."""
    world = f"{shared_dirs(load_config(REPO / 'config/smoke.yaml'))['data']}/world.json"
    first = snakemake(tmp_path, SMOKE, world)  # a real run (make-suites only): onstart records the settings
    assert first.returncode == 0, first.stderr[-3000:]
    record = tmp_path / "results/smoke" / RECORD
    assert record.is_file()
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "results").rglob("*") if p.is_file()}

    other = edited(lambda c: (c["grpo"].update(lr=0.001), c["policies"]["toy-nova"]["sampling"].update(cfg_scale=2.0)))
    out = snakemake(tmp_path, other, "-n")
    shown = out.stdout + out.stderr
    assert out.returncode != 0, shown[-2000:]
    assert "key 'name': 'smoke' already holds runs made with other settings" in shown, shown[-2000:]
    assert "grpo.lr, policies.toy-nova.sampling.cfg_scale" in shown, shown[-2000:]
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())

    same_runs = edited(
        lambda c: (c["report"].update(confidence=0.9), c["experiments"]["ladder"].update(seeds=[0, 1, 3]))
    )
    assert snakemake(tmp_path, same_runs, "-n").returncode == 0  # more seeds, other plots: the same runs
    renamed = other.replace("name: smoke", "name: smoke-lr")
    assert snakemake(tmp_path, renamed, "-n").returncode == 0


def test_the_settings_record_compares_what_reruns_runs(tmp_path):
    cfg = load_config(REPO / "config/smoke.yaml")
    check_experiment(cfg, tmp_path)  # no record: nothing to compare
    record_experiment(cfg, tmp_path)
    assert (tmp_path / "smoke" / RECORD).is_file() and "report" not in experiment_settings(cfg)
    check_experiment(cfg, tmp_path)
    cfg["threads"] = 2
    with pytest.raises(ConfigError, match=r"key 'name'.*differing: threads\);"):
        check_experiment(cfg, tmp_path)
    (tmp_path / "smoke" / RECORD).write_text("{torn")
    with pytest.raises(ConfigError, match="not a readable settings record"):
        check_experiment(cfg, tmp_path)


def test_stage_arguments_pass_the_dry_runs_checks(tmp_path):
    """Issue #31.4: `margrpo train` with val_prompts above the validation suite validated on fewer prompts (the dry
    run refuses the key); `sample --max-prompts -5` sampled 7 of 12 prompts, `--images-per-prompt 0` divided by
    zero."""
    import json

    from margrpo.cli import main
    from margrpo.experiment.config import train_spec
    from margrpo.prompts.suites import PromptRecord, write_suite

    suites = tmp_path / "suites"
    spec = {
        "objects": [{"color": "red", "shape": "circle", "texture": None, "count": 1}],
        "relation": None,
        "exact_count": False,
    }
    for split in ("train", "val"):
        write_suite([PromptRecord("a red circle", "color", spec)], suites / f"{split}.jsonl")
    run = train_spec(load_config(REPO / "config/smoke.yaml"), "toy-nova", "toyclip", "grpo")
    run["grpo"]["val_prompts"] = 2
    with pytest.raises(
        SystemExit,
        match=re.escape(
            "--spec-json: key 'grpo.val_prompts': 2 exceeds the 1 prompts of the validation "
            f"suite ({suites / 'val.jsonl'})"
        ),
    ):
        main(
            [
                "train",
                "--policy-dir",
                str(tmp_path / "none"),
                "--suites-dir",
                str(suites),
                "--spec-json",
                json.dumps(run),
                "--out-dir",
                str(tmp_path / "run"),
            ]
        )
    run["grpo"].update(val_prompts=1, micro_batches=5)
    with pytest.raises(
        SystemExit, match=re.escape("--spec-json: key 'grpo.micro_batches': 5 micro-batches do not divide")
    ):
        main(
            [
                "train",
                "--policy-dir",
                str(tmp_path / "none"),
                "--suites-dir",
                str(suites),
                "--spec-json",
                json.dumps(run),
                "--out-dir",
                str(tmp_path / "run"),
            ]
        )
    assert not (tmp_path / "run").exists()

    sample = [
        "sample",
        "--policy",
        str(tmp_path / "none"),
        "--suite",
        str(suites / "val.jsonl"),
        "--sampling-json",
        "{}",
        "--out-dir",
        str(tmp_path / "samples"),
    ]
    with pytest.raises(
        SystemExit, match=re.escape("--max-prompts: -5; expected 0 (every prompt of the suite) or a positive count")
    ):
        main([*sample, "--max-prompts", "-5"])
    with pytest.raises(SystemExit, match=re.escape("--images-per-prompt: 0; expected at least 1")):
        main([*sample, "--images-per-prompt", "0"])


def test_make_run_reads_its_config_files_before_snakemake(tmp_path):
    """Issue #31: Snakemake runs a YTE config's code at load; `make run` / `make report` check the files first."""
    from margrpo.experiment.config_checks import main, snakemake_config_files

    assert snakemake_config_files(
        ["--cores", "1", "--configfile", "a.yaml", "b.yaml", "-n", "--configfiles=c.yaml"]
    ) == ["a.yaml", "b.yaml", "c.yaml"]
    bad = tmp_path / "yte.yaml"
    bad.write_text(f"__use_yte__: true\nname: ?'x' + __import__('os').system('touch {tmp_path}/pwned')\n")
    assert main(["--configfile", str(REPO / "config/smoke.yaml")]) == 0
    assert main(["--configfile", str(REPO / "config/smoke.yaml"), str(bad)]) == 1
    out = subprocess.run(
        ["make", "-n", "run", f"SNAKEMAKE_ARGS=--configfile {bad}"], cwd=REPO, capture_output=True, text=True
    )
    lines = out.stdout.splitlines()
    check = next(i for i, line in enumerate(lines) if "-m margrpo.experiment.config_checks" in line)
    assert check < next(i for i, line in enumerate(lines) if "snakemake --cores" in line)
    assert not (tmp_path / "pwned").exists()
