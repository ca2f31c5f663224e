"""What each stage reads of an experiment config: `margrpo train`'s spec, pre-training's settings, the
related methods' specs, and the shared stages' folders, each named by a hash of exactly those settings.

Snakemake passes a stage these pieces rather than the whole config, so that editing an unrelated
option never reruns it. Built on the validated config (`margrpo.experiment.config`), checked with the
schema's helpers (`margrpo.experiment.schema`).
"""

from __future__ import annotations

import copy

from margrpo.experiment.schema import (
    ConfigError,
    check_defined,
    check_finite,
    check_schema,
    schema_section,
    validate_section,
)
from margrpo.infra.files import spec_hash

LATER_GRPO_KEYS = (
    "trackers",
    "ema_decay",
    "advantages",
    "replay_chunk",
    "grad_variance",
)  # grpo keys added after runs were cached


def train_spec(config: dict, policy: str, reward: str, variant: str, variant_overrides: dict | None = None) -> dict:
    """Everything one GRPO run depends on, and nothing else.

    Snakemake passes this (not the whole config) to `margrpo train`, so editing a plot option
    never invalidates a training run.
    """
    for kind, name, flag in (
        ("policies", policy, "--policy"),
        ("rewards", reward, "--reward"),
        ("variants", variant, "--variant"),
    ):
        check_defined(config, kind, [name], flag, "train")
    var = dict(config["variants"][variant])
    var.update(variant_overrides or {})
    var.pop("overrides", None)
    grpo = grpo_settings(config, policy, variant)
    settings = policy_settings(config["policies"][policy])
    defaults = schema_section("grpo")["properties"]
    for key in LATER_GRPO_KEYS:  # at their default they stay out, so that runs cached before them keep their spec
        if key in grpo and grpo[key] == defaults[key]["default"]:
            del grpo[key]
    weights = config["rewards"][reward]
    return {
        "grpo": grpo,
        **({"policy": settings} if settings else {}),  # only when set: other runs keep their cached spec
        "variant": {"name": variant, **var},
        "reward": {"name": reward, "weights": weights},
        "reward_models": {k: v for k, v in config["reward_models"].items() if k in weights},
        "sampling": config["policies"][policy]["sampling"],
        "device": config["device"],
        "mixed_precision": config["mixed_precision"],
        "threads": config["threads"],
    }


def grpo_settings(config: dict, policy: str, variant: str) -> dict:
    """The GRPO settings a run of `variant` on `policy` trains with: grpo, then the policy's own
    (`policies.<name>.grpo`, what makes RL work on that base), then the variant's overrides, each a delta on the one
    before."""
    return {
        **config["grpo"],
        **(config["policies"][policy].get("grpo") or {}),
        **(config["variants"][variant].get("overrides") or {}),
    }


POLICY_SETTINGS = {"rl_frozen": "frozen", "gradient_checkpointing": "gradient_checkpointing", "lora": "lora"}


def policy_settings(policy: dict) -> dict:
    """How RL holds this policy (policy.settings.PolicySettings), the settings that differ from their defaults."""
    out = {ours: policy[key] for key, ours in POLICY_SETTINGS.items() if policy.get(key)}
    if policy.get("sharding", "replicate") != "replicate":
        out["sharding"] = policy["sharding"]
    return copy.deepcopy(out)


def validate_train_spec(spec: dict, what: str = "--spec-json") -> dict:
    """A `train_spec` (as `margrpo train` receives it) checked section by section against the schema."""
    missing = sorted({"grpo", "variant", "reward", "sampling"} - set(spec))
    if missing:
        raise ConfigError(f"{what}: missing key(s) {missing} (a margrpo.experiment.config.train_spec)")
    spec = copy.deepcopy(spec)
    spec["grpo"] = validate_section(spec["grpo"], "grpo", f"{what} grpo")
    policy = schema_section("policies.*")["properties"]
    ours = {v: k for k, v in POLICY_SETTINGS.items()} | {"sharding": "sharding"}
    for key, value in spec.get("policy", {}).items():
        if key not in ours:
            raise ConfigError(f"{what}: key 'policy.{key}': not a policy setting (expected {', '.join(sorted(ours))})")
        check_schema(policy[ours[key]], value, f"{what} policy.{key}")
    name = spec["variant"].pop("name", None)
    spec["variant"] = {"name": name, **validate_section(spec["variant"], "variants.*", f"{what} variant")}
    spec["variant"].pop("overrides", None)
    spec["sampling"] = validate_section(spec["sampling"], "policies.*.sampling", f"{what} sampling")
    check_schema(schema_section("rewards.*"), spec["reward"].get("weights"), f"{what} reward.weights")
    check_finite(spec["reward"].get("weights"), f"{what} reward.weights")
    return spec


def pretrain_settings(policy: dict) -> dict:
    """What pre-training reads of a policy's config, and nothing else: editing its warm-up, RL or
    weights settings never reruns pre-training."""
    return {k: policy[k] for k in ("kind", "head", "model", "pretrain", "sampling")}


# The revision of the toy models' code defaults and architectures (ToyMARConfig, the toy text encoder,
# toyclip, toy-mask). Part of the hash of every stage that trains one, so that a change of what the code
# builds, not only of the config, moves those folders: no result of an older toy is read as new.
# 2: the toy in the real models' proportions (a 64-wide head, 9% of the parameters; our own text stack).
# 3: scenes on a backdrop that varies per scene (the aesthetic of the toy preference reward, toypref).
# 4: the kernel caps' strict MKL branch; the bases on 24-channel latent tokens of a frozen PCA codec.
TOY_REVISION = 4

# The code each shared toy stage's result depends on (files under margrpo/): every file whose functions run in the
# stage, the data stage's included, except plumbing that cannot change a number (SOURCE_PLUMBING).
# tests/test_toy_weights.py traces the smoke stages and fails where a list misses a file. A shipped stage
# (margrpo.infra.weights: the toy's release) whose files' code has changed since it was trained is trained instead.
_DATA_SOURCES = (
    "infra/kernels.py",
    "prompts/shapesworld.py",
    "prompts/suites.py",
    "stages/_common.py",
    "stages/make_suites.py",
    "world/captions.py",
    "world/config.py",
    "world/scene.py",
)
_TOYCLIP_SOURCES = (
    "infra/runtime.py",
    "policy/layers.py",
    "policy/text.py",
    "prompts/analysis.py",
    "rewards/toyclip.py",
    "stages/train_toyclip.py",
    "toylab/toyclip_training.py",
    "world/negatives.py",
)
STAGE_SOURCES = {
    "toyclip": _DATA_SOURCES + _TOYCLIP_SOURCES,
    "toypref": _DATA_SOURCES
    + _TOYCLIP_SOURCES
    + ("rewards/toypref.py", "stages/train_toypref.py", "toylab/toypref_training.py"),
    "pretrain": _DATA_SOURCES
    + (
        "diffusion/common.py",
        "diffusion/ddpm.py",
        "diffusion/flow.py",
        "evaluation/quality.py",
        "grpo/rollout.py",
        "infra/ema.py",
        "infra/runtime.py",
        "policy/base.py",
        "policy/checkpointing.py",
        "policy/codec.py",
        "policy/invariant.py",
        "policy/layers.py",
        "policy/text.py",
        "policy/toy.py",
        "stages/pretrain.py",
        "toylab/pretraining.py",
        "world/parser.py",
        "world/scoring.py",
    ),
}
SOURCE_PLUMBING = (
    "cli.py",
    "infra/files.py",
    "infra/process_group.py",
    "experiment/schema.py",
    "reporting/figures.py",
    "rewards/registry.py",
)


def shared_dirs(config: dict, results: str = "results", stages: dict | None = None) -> dict:
    """Folders of the stages that experiments share, each keyed by a hash of exactly the settings
    that stage reads, its inputs' folders included (`results/pretrain/toy-nova-1a2b3c4d`): configs
    coexist, and share a stage exactly where those settings agree. Each folder's spec.json (written
    by its stage) records what it ran with.

    Returns {"data": dir, "toyclip": dir, "toypref": dir, "base": {policy: dir}, "warmup": {policy: dir},
    "related": {policy: dir}};
    "base" holds results/pretrain/<policy>-<hash> (toy) or results/weights/<policy>-<hash> (real weights);
    "related" the bases of Table 3's related methods (toy-mask, toy-marval) when that experiment is on.
    `stages`, if given, receives {folder: {"stage", "settings"}} of every folder named (`toy_stages` reads it).
    """

    def folder(stage: str, label: str, settings: dict) -> str:
        path = f"{results}/{stage}/{label}-{spec_hash(settings)}"
        if stages is not None:
            stages[path] = {"stage": stage, "settings": settings}
        return path

    prompts, precision = config["prompts"], config["mixed_precision"]
    data = folder(
        "data",
        prompts["source"],
        {"prompts": prompts, "world": config["world"] if prompts["source"] == "shapesworld" else None},
    )
    toy = {"toy_revision": TOY_REVISION}
    toyclip = folder("toyclip", "toyclip", {"data": data, **toy, **_without(config["toyclip"], "enabled")})
    dirs = {
        "data": data,
        "toyclip": toyclip,
        "toypref": folder("toypref", "toypref", {"toyclip": toyclip, **toy, **_without(config["toypref"], "enabled")}),
        "base": {},
        "warmup": {},
        "related": {},
    }
    for name, policy in config["policies"].items():
        if policy["kind"] == "toy":
            # sampling shapes only the quality report: a change reruns the job, which finds its training
            # finished in state/ (keyed without sampling) and rewrites policy/ and quality.json
            base = folder(
                "pretrain",
                name,
                {"data": data, "precision": precision, **toy, **_without(pretrain_settings(policy), "sampling")},
            )
        else:
            base = folder("weights", name, {"kind": policy["kind"], "path": policy["path"]})
        dirs["base"][name] = base
        if policy["warmup"]["enabled"]:
            dirs["warmup"][name] = folder(
                "warmup",
                name,
                {"policy": base, "data": data, "precision": precision, **_without(policy["warmup"], "enabled")},
            )  # sampling: as pre-training
    if config["experiments"]["related"]["enabled"]:
        dirs["related"] = _related_dirs(config, dirs, folder)
    return dirs


def toy_stages(config: dict, results: str = "results") -> dict[str, dict]:
    """The shared stages the toy's release can ship (toyclip, toypref, the toy base policies' pre-training), as
    {folder: {"stage", "settings", "sources"}}: a shipped folder stands for a stage of the same settings and code."""
    named: dict[str, dict] = {}
    dirs = shared_dirs(config, results, named)
    wanted = [dirs["toyclip"], dirs["toypref"], *(d for d in dirs["base"].values() if named[d]["stage"] == "pretrain")]
    if not config["toyclip"]["enabled"]:
        wanted = [d for d in wanted if d not in (dirs["toyclip"], dirs["toypref"])]
    elif not config["toypref"]["enabled"]:
        wanted.remove(dirs["toypref"])
    return {d: {**named[d], "sources": list(STAGE_SOURCES[named[d]["stage"]])} for d in wanted}


def _related_dirs(config: dict, dirs: dict, folder) -> dict[str, str]:
    """The related methods' bases (issue #19): toy-mask pre-trained on the data, toy-marval distilled from its
    teacher's folder (the warm-up's where it has one). `folder(stage, label, settings)` names a folder."""
    teacher = config["experiments"]["related"]["marval"]["teacher"]
    teacher_dir = dirs["warmup"].get(teacher, dirs["base"][teacher])
    toy = {"toy_revision": TOY_REVISION}
    return {
        "toy-mask": folder(
            "pretrain",
            "toy-mask",
            {"data": dirs["data"], **toy, **_without(related_policy(config, "toy-mask"), "sampling")},
        ),
        "toy-marval": folder(
            "distill",
            "toy-marval",
            {
                "teacher": teacher_dir,
                "data": dirs["data"],
                **_without(related_policy(config, "toy-marval"), "sampling"),
            },
        ),
    }


RELATED_POLICIES = {
    "grpo-onestep": "toy-marval",
    "marval-rl": "toy-marval",
    "grpo-mask": "toy-mask",
    "maskgrpo": "toy-mask",
}


def related_policy(config: dict, name: str) -> dict:
    """The policy entry `margrpo pretrain-mask` (toy-mask) or `margrpo distill-marval` (toy-marval) reads."""
    related = config["experiments"]["related"]
    if name == "toy-mask":
        return {"kind": "toy-mask", **related["mask"]}
    teacher = related["marval"]["teacher"]
    return {
        "kind": "toy-marval",
        "teacher": teacher,
        "distill": related["marval"]["distill"],
        "sampling": {**config["policies"][teacher]["sampling"], **related["marval"]["sampling"]},
    }


def related_train_spec(config: dict, method: str) -> dict:
    """What one related run depends on: `margrpo train`'s spec for GRPO on the one-step policy (|T| = 1),
    else the spec `margrpo train-related` reads (the method's own settings)."""
    related = config["experiments"]["related"]
    reward = related["reward"]
    settings = dict(related["settings"][method])
    if method == "grpo-onestep":
        spec = train_spec(config, related["marval"]["teacher"], reward, "grpo")
        spec["sampling"] = related_policy(config, "toy-marval")["sampling"]
        spec["grpo"].update({"diffusion_steps": 1, **settings})
        return spec
    sampling = related_policy(config, RELATED_POLICIES[method]).get("sampling", {})
    return {
        "method": method,
        "related": settings,
        "reward": {"name": reward, "weights": config["rewards"][reward]},
        "reward_models": {k: v for k, v in config["reward_models"].items() if k in config["rewards"][reward]},
        "sampling": sampling,
        "device": config["device"],
        "mixed_precision": config["mixed_precision"],
    }


def _without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}
