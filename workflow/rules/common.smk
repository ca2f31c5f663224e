# Schema validation and the get_* functions that keep the rules declarative.
import json
import re
import shlex
import sys
from pathlib import Path, PurePosixPath
from types import SimpleNamespace

import pandas as pd
from snakemake.exceptions import WorkflowError
from snakemake.utils import Paramspace

if workflow.overwrite_configfiles:
    # `--configfile X` replaces config/config.yaml instead of deep-merging into the toy defaults.
    config.clear()
    config.update(workflow.config_settings.overwrite_config)

from margrpo.experiment.config import (  # noqa: E402
    RELATED_POLICIES,
    name_pattern,
    names_scorer,
    pretrain_settings,
    read_config_file,
    related_policy,
    related_train_spec,
    shared_dirs,
    train_spec,
    validate_config,
)
from margrpo.experiment.config_checks import ESTIMATOR_VARIANTS  # noqa: E402
from margrpo.experiment.record import check_experiment, record_experiment  # noqa: E402
from margrpo.experiment.specs import grpo_settings, toy_stages  # noqa: E402
from margrpo.infra.weights import RELEASE, fresh_folders  # noqa: E402
from margrpo.infra.slurm import train_job  # noqa: E402

# The rules' `margrpo` (and the train launcher's `python`) are those of the environment running Snakemake, the one
# that imported margrpo above, however Snakemake was started: .venv/bin/snakemake by its path, an activated venv, a
# conda env. Jobs inherit this PATH; a rule's own conda env (--sdm conda) is activated after it and comes first.
# The rules' text names no interpreter: a path in it would read as changed code, and rerun every job, from another env.
ENV_BIN = os.path.dirname(sys.executable)
for _command in ("margrpo", "python"):
    if not os.access(os.path.join(ENV_BIN, _command), os.X_OK):
        raise WorkflowError(
            f"`{_command}` is not in {ENV_BIN}, beside {sys.executable} that runs Snakemake: every rule calls it."
            " Install the project into that environment (`make install`, or `pip install -e .`)"
        )
os.environ.update(PATH=os.pathsep.join(filter(None, [ENV_BIN, os.environ.get("PATH")])))  # set, not read: no envvars

# ../schemas/config.schema.yaml (defaults filled) and every check beyond it: cross references, variant
# overrides, the ablation table; errors name the key path. The files are read again by margrpo's loader,
# which refuses a key given twice (Snakemake's keeps the last) and YTE templates (Snakemake has run them by now)
CONFIG_FILES = list(map(str, workflow.overwrite_configfiles or [os.path.join(workflow.basedir, "config/config.yaml")]))
for _file in CONFIG_FILES:
    read_config_file(_file)
validate_config(config, ", ".join(CONFIG_FILES), root=workflow.basedir)

RESULTS = "results"
# results/<name>/ is this config's alone: refused if it holds runs made with other settings (the first run records them)
check_experiment(config, RESULTS, ", ".join(CONFIG_FILES))


onstart:
    record_experiment(config, RESULTS)


# Stages every experiment on this world shares (data, toyclip, pre-training, warm-up, weight checks), each
# in a folder keyed by a hash of the settings it reads: results/pretrain/toy-nova-1a2b3c4d (margrpo.experiment.config).
SHARED = shared_dirs(config, RESULTS)
# The toy's shared stages that its release ships for these settings and this code (toy_weights: shipped): the
# DAG places them (rules/release.smk) instead of training them. A shipped folder that no longer matches is trained,
# and said so here.
TOY_RELEASE = config["toy_release"] or str(RELEASE)
SHIPPED = []
if config["toy_weights"] == "shipped":
    SHIPPED, _unshipped = fresh_folders(toy_stages(config, RESULTS), Path(TOY_RELEASE))
    for _folder, _why in _unshipped.items():
        if _why != "not in the release":
            print(f"toy_weights: shipped: {_folder} is trained here: {_why} (`make toy-weights` regenerates the release)", file=sys.stderr)
DATA, TOYCLIP, TOYPREF = SHARED["data"], SHARED["toyclip"], SHARED["toypref"]
NAME = config["name"]
RUNS = f"{RESULTS}/{NAME}"  # this experiment's runs, evaluations and report: configs never overwrite each other
EXP = config["experiments"]
# Table 3's related bases (toy-mask, toy-marval); placeholders that nothing asks for while the experiment is off
RELATED_DIRS = SHARED["related"] or {p: f"{RESULTS}/related-off/{p}" for p in ("toy-mask", "toy-marval")}
POLICY_NAMES = "|".join(re.escape(p) for p in config["policies"])  # the train rule's policies (not the related ones)
# GPUs are asked for where the config runs on them (device not cpu), or where `request_gpus` says so on its own
GPU = int(config["device"] != "cpu" if config["request_gpus"] == "auto" else config["request_gpus"])
TRAIN_PROCS = config["train_processes"]  # data parallel GRPO: one GPU (or `threads` CPU threads) per process, per node
TRAIN_NODES = config["train_nodes"]
# `margrpo train` as one process; as TRAIN_PROCS processes of one machine (margrpo.infra.launch, its rendezvous on
# 127.0.0.1 only); or on TRAIN_NODES nodes, torchrun started by srun once per node. What SLURM is asked for in each
# case, and why: margrpo.infra.slurm
TRAIN_JOB = train_job(TRAIN_PROCS, TRAIN_NODES, bool(GPU), config["train_port"], config["threads"])
TRAIN_LAUNCH, TRAIN_RESOURCES = TRAIN_JOB.launch, TRAIN_JOB.resources


# the site's account, partition and QOS (config slurm.account / partition / qos), on every job SLURM runs
SITE = {
    resource: config["slurm"][key]
    for key, resource in (("account", "slurm_account"), ("partition", "slurm_partition"), ("qos", "qos"))
    if config["slurm"].get(key)
}


def slurm(stage):
    """A GPU stage's runtime (minutes) and memory (MB per node) on SLURM, and the site's settings: the config's
    `slurm` section."""
    return {**SITE, **config["slurm"][stage]}


def is_toy(policy):
    return config["policies"][policy]["kind"] == "toy"


def resolve(path):
    """A config path relative to the working directory, else to the repository (for --directory runs)."""
    return path if os.path.exists(path) else os.path.join(workflow.basedir, path)


# Fig. 7's grid points, each a folder name top_frac~0.3_tau~0.0_trajectories~4 held by the train rule's `setting` wildcard
ABLATIONS = Paramspace(pd.read_csv(resolve(EXP["ablations"]["table"]), sep="\t"), filename_params="*", single_wildcard="setting")
# the train rule's `setting`: a variant's name (train/ runs) or one of the grid's points (ablation/ runs)
TRAIN_SETTINGS = "|".join([name_pattern(), *(re.escape(p) for p in ABLATIONS.instance_patterns)])


def folder_names(dirs):
    """The wildcard pattern matching exactly these shared folders (by name), and name -> policy."""
    names = {os.path.basename(d): policy for policy, d in dirs.items()}
    return "|".join(re.escape(n) for n in names) or "(?!)", names


PRETRAIN_IDS, PRETRAINED = folder_names({p: d for p, d in SHARED["base"].items() if is_toy(p)})
WEIGHTS_IDS, WEIGHTS = folder_names({p: d for p, d in SHARED["base"].items() if not is_toy(p)})
WARMUP_IDS, WARMED = folder_names(SHARED["warmup"])


wildcard_constraints:
    pretrained=PRETRAIN_IDS,
    weights=WEIGHTS_IDS,
    warmed=WARMUP_IDS,
    policy=name_pattern(),  # the schema's names: a config name always matches its wildcard
    reward=name_pattern(),
    variant=name_pattern(),
    seed=r"\d+",
    run=r"(base/[^/]+|train/.+/seed\d+|ablation/.+/seed\d+)",


def uses_toyclip():
    return config["toyclip"]["enabled"]


def get_suites():
    return multiext(f"{DATA}/", "train.jsonl", "val.jsonl", "eval.jsonl")


def get_base_policy(wildcards):
    """The policy RL starts from: warmed-up if the config asks for warm-up, else pre-trained/loaded."""
    if wildcards.policy in SHARED["related"]:
        return f"{SHARED['related'][wildcards.policy]}/policy"
    if wildcards.policy in SHARED["warmup"]:
        return f"{SHARED['warmup'][wildcards.policy]}/policy"
    return get_loaded_policy(wildcards.policy)


def table1_warmups():
    """{policy: its warm-up's quality.json} for Table 1's bases that are warmed up (the caption's note on it)."""
    return {p: f"{SHARED['warmup'][p]}/quality.json" for p in EXP["table1"]["policies"] if p in SHARED["warmup"]}


def get_loaded_policy(policy):
    """Toy policies are pre-trained here; real ones are checked in place (a pointer file, no copy)."""
    return f"{SHARED['base'][policy]}/" + ("policy" if is_toy(policy) else "policy.json")


def uses_toypref():
    """toypref is trained only where a reward setting or the preference evaluation names it."""
    return config["toypref"]["enabled"] and names_scorer(config, "toypref")


def get_reward_inputs(wildcards):
    return ([f"{TOYCLIP}/model"] if uses_toyclip() else []) + ([f"{TOYPREF}/model"] if uses_toypref() else [])


def get_train_spec(wildcards):
    """A train job's spec: its variant's (train/), or the ablations' variant with the grid point's values (ablation/)."""
    if wildcards.kind == "train":
        return json.dumps(train_spec(config, wildcards.policy, wildcards.reward, wildcards.setting))
    values = ABLATIONS.instance(wildcards)  # the point's values, read back from its folder name
    overrides = {k: (int(v) if k == "trajectories" else float(v)) for k, v in values.items()}
    return json.dumps(train_spec(config, wildcards.policy, wildcards.reward, EXP["ablations"]["variant"], overrides))


def ladder_runs():
    """Every variant on `seeds`, and the second seed set's variants on `replicate_seeds`; the claims keep the sets apart."""
    L = EXP["ladder"]
    again = L["variants"] if L["replicate_variants"] is None else L["replicate_variants"]
    sets = [(L["variants"], L["seeds"]), (again, L["replicate_seeds"])]
    return [f"train/{p}/{r}/{v}/seed{s}" for p in L["policies"] for r in L["rewards"] for vs, seeds in sets for v in vs for s in seeds]


def climb_runs():
    """The climbing ladder's runs (experiments.climb): every rung and its control on every seed; [] where off."""
    C = EXP["climb"]
    if not C["enabled"]:
        return []
    return [f"train/{p}/{r}/{v}/seed{s}" for p in C["policies"] for r in C["rewards"] for v in C["variants"] for s in C["seeds"]]


def ladders_spec():
    """What Table 2, val_gain and the claims read of both ladders: their runs, variants in order, and the climbing
    ladder's control (the variant each rung of its blocks is compared with)."""
    C = EXP["climb"]
    variants = list(dict.fromkeys(EXP["ladder"]["variants"] + (C["variants"] if C["enabled"] else [])))
    return {"base": base_runs(), "runs": ladder_runs() + climb_runs(), "variants": variants,
            "control": C["control"] if C["enabled"] else None}


def table1_runs():
    T = EXP["table1"]
    return [f"train/{p}/{r}/{v}/seed{s}" for p in T["policies"] for r in T["rewards"] for v in (T["baseline"], T["ours"]) for s in T["seeds"]]


def ablation_runs():
    a = EXP["ablations"]
    if not a["enabled"]:
        return []
    return [f"ablation/{a['policy']}/{a['reward']}/{p}/seed{s}" for p in ABLATIONS.instance_patterns for s in a["seeds"]]


def related_runs():
    """Every run Table 3 reports: the MAR-GRPO row (ladder runs) and each related method's runs."""
    R = EXP["related"]
    if not R["enabled"]:
        return []
    mar = [f"train/{R['mar_grpo']['policy']}/{R['reward']}/{R['mar_grpo']['variant']}/seed{s}" for s in R["seeds"]]
    return mar + [f"train/{RELATED_POLICIES[m]}/{R['reward']}/{m}/seed{s}" for m in R["methods"] for s in R["seeds"]]


def related_bases():
    R = EXP["related"]
    if not R["enabled"]:
        return []
    return sorted({f"base/{R['mar_grpo']['policy']}"} | {f"base/{RELATED_POLICIES[m]}" for m in R["methods"]})


RELATED_LABELS = {"grpo-onestep": "GRPO (one-step)", "marval-rl": "MARVAL-RL", "grpo-mask": "GRPO (discrete)", "maskgrpo": "MaskGRPO"}


def related_spec():
    """What `margrpo report table3 / related-wallclock` reads: one entry per method, with its own base."""
    R, runs = EXP["related"], related_runs()
    mar = R["mar_grpo"]
    methods = [{"label": f"MAR-GRPO ({mar['variant']})", "base": f"base/{mar['policy']}", "runs": runs[: len(R["seeds"])]}]
    for m in R["methods"]:
        methods.append({"label": RELATED_LABELS[m], "base": f"base/{RELATED_POLICIES[m]}",
                        "runs": [r for r in runs if r.split("/")[3] == m]})
    return {"methods": methods}


def base_runs():
    policies = set(EXP["ladder"]["policies"]) | set(EXP["table1"]["policies"])
    policies |= set(EXP["climb"]["policies"]) if EXP["climb"]["enabled"] else set()
    return [f"base/{p}" for p in sorted(policies)]


def all_eval_runs():
    return sorted(set(base_runs() + ladder_runs() + climb_runs() + table1_runs() + ablation_runs() + related_bases() + related_runs()))


def get_eval_outputs(runs):
    return [f"{RUNS}/eval/{run}/{name}.csv" for run in runs for name in ("compbench", "preference")]


def get_selection_input(wildcards):
    return f"{RUNS}/{wildcards.run}/summary.json"


def get_sample_policy(wildcards):
    """Base runs sample the base policy; trained runs sample the checkpoint chosen by `select`."""
    if wildcards.run.startswith("base/"):
        return get_base_policy(type("W", (), {"policy": run_policy(wildcards.run)}))
    return f"{RUNS}/select/{wildcards.run}/selection.json"


def variant_for_run(run):
    kind, policy, reward, variant_or_params, _ = run.split("/", 4)
    return EXP["ablations"]["variant"] if kind == "ablation" else variant_or_params


def get_report_step(wildcards):
    if variant_for_run(wildcards.run) in RELATED_POLICIES:  # a related method: the experiment's own rule
        return EXP["related"]["report_step"]
    name = variant_for_run(wildcards.run)
    step = config["variants"][name]["report_step"]
    if step == "last":
        step = grpo_settings(config, run_policy(wildcards.run), name)["steps"]
    return "best" if step is None else str(step)

REPORT = f"{RUNS}/report"
# the estimators' stage (rules/estimators.smk): the exact gradient and each estimator's batches, per base
ESTIMATES = f"{RUNS}/estimators"


def estimator_block():
    E = EXP["estimators"]
    return {"policy": E["policy"], "reward": E["reward"], "dir": f"estimators/{E['policy']}/{E['reward']}", "estimators": E["estimators"],
            "checkpoints": {**E["checkpoints"], "seeds": EXP["ladder"]["seeds"]} if E["checkpoints"]["variants"] else None}


def estimator_outputs():
    """Every estimator's batches.json and the exact gradient's record; nothing where the stage is off."""
    if not EXP["estimators"]["enabled"]:
        return []
    E = EXP["estimators"]
    folder = f"{ESTIMATES}/{E['policy']}/{E['reward']}"
    return [f"{folder}/exact.json"] + [f"{folder}/{e}/batches.json" for e in E["estimators"]]


def checkpoint_outputs():
    """The AR part's batches at every ladder seed's checkpoints of experiments.estimators.checkpoints; [] where off."""
    E = EXP["estimators"]
    C = E["checkpoints"]
    if not E["enabled"] or not C["variants"]:
        return []
    folder = f"{ESTIMATES}/{E['policy']}/{E['reward']}/checkpoints"
    return expand(
        f"{folder}/{{variant}}/seed{{seed}}/step{{step}}/fix/batches.json",
        variant=C["variants"], seed=EXP["ladder"]["seeds"], step=C["steps"],
    )


def checkpoint_policy(summary, step):
    """A ladder run's policy folder at `step` (its summary.json beside state/; grpo.run_files.checkpoint_path, not
    imported here: the grpo package imports torch), a folder the run keeps."""
    return os.path.join(os.path.dirname(summary), "state", f"ckpt-{step:06d}", "policy")



def report_cmd(what):
    return (
        f"margrpo report {what} --runs-json {{params.runs:q}} --results {{params.results:q}}"
        " --out-prefix {params.prefix:q} --formats {params.formats:q} --confidence {params.confidence:q} > {log:q} 2>&1"
    )


REPORT_PARAMS = dict(results=lambda wc, input: experiment_root(input), formats=",".join(config["report"]["formats"]), confidence=config["report"]["confidence"])



def estimator_spec(wildcards):
    """The train spec an estimator is built on (exact_gradient, which has no `estimator` wildcard: +Fix's)."""
    name = wildcards.get("estimator", "fix")
    return json.dumps(train_spec(config, wildcards.policy, wildcards.reward, ESTIMATOR_VARIANTS.get(name, name)))


ESTIMATOR_INPUTS = dict(policy=get_base_policy, suites=get_suites(), rewards=get_reward_inputs)
ESTIMATOR_PARAMS = dict(
    spec=estimator_spec,
    suites_dir=lambda wc, input: os.path.dirname(input.suites[0]),
    toyclip=f"{TOYCLIP}/model",
    toypref=f"{TOYPREF}/model",
    out_dir=lambda wc: f"{ESTIMATES}/{wc.policy}/{wc.reward}",
)


def experiment_root(input):
    """`results/<name>`, derived from an input under it (`results/<name>/eval/...`): lint wants derived prefixes."""
    return str(PurePosixPath(*PurePosixPath(input[0]).parts[: len(PurePosixPath(RUNS).parts)]))


def report_prefix(output):
    """`results/toy/report/table1.csv` -> `results/toy/report/table1` (every output shares the stem)."""
    return os.path.splitext(output[0])[0]


def run_policy(run):
    """`train/<policy>/<reward>/<variant>/seed<s>` or `base/<policy>` -> policy name."""
    return PurePosixPath(run).parts[1]


def get_sampling_json(wildcards):
    policy = run_policy(wildcards.run)
    if policy in SHARED["related"]:
        return json.dumps(related_policy(config, policy).get("sampling", {}))
    return json.dumps(config["policies"][policy]["sampling"])


def get_final_outputs():
    R = REPORT
    fmts = config["report"]["formats"]
    outs = expand(f"{R}/{{table}}.{{ext}}", table=["table1", "table2", "val_gain"], ext=["csv", "md", "tex"])
    outs += expand(f"{R}/{{f}}", f=["claims.csv", "claims_paired.csv", "claims.md", "artifacts.csv", "artifacts.md"])
    figs = ["fig2_dynamics", "fig4_uncertainty", "fig6_samples"] + ["fig_climb"] * EXP["climb"]["enabled"]
    if EXP["ablations"]["enabled"]:
        figs += ["fig7a_samples", "fig7b_reward_curves", "fig7c_final_metric"]
    if EXP["related"]["enabled"]:
        outs += expand(f"{R}/table3.{{ext}}", ext=["csv", "md", "tex"])
        figs += ["fig_related_wallclock"]
    if EXP["estimators"]["enabled"]:
        outs += expand(f"{R}/estimators.{{ext}}", ext=["csv", "md"])
        figs += ["fig_estimators"]
        if EXP["estimators"]["checkpoints"]["variants"]:
            outs += expand(f"{R}/checkpoint_gradients{{f}}", f=[".csv", "_ratios.csv", ".md"])
            figs += ["fig_checkpoint_gradients"]
    outs += expand(f"{R}/{{fig}}.{{ext}}", fig=figs, ext=fmts)
    return outs


def suite_source_args():
    """make-suites arguments: ShapesWorld knobs (toy) or the real prompt files (prompts.source: files)."""
    p = config["prompts"]
    if p["source"] == "shapesworld":
        return " ".join(f"--{k.replace('_', '-')} {shlex.quote(str(v).lower())}" for k, v in config["world"].items())
    args = ["--source files", f"--train-file {shlex.quote(p['train_file'] or '')}", f"--eval-dir {shlex.quote(p['eval_dir'] or '')}",
            f"--categories {shlex.quote(','.join(p['eval_categories']))}"]
    if p["val_file"]:
        args.append(f"--val-file {shlex.quote(p['val_file'])}")
    return " ".join(args)

