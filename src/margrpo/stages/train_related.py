"""`margrpo train-related`: one run of a related method (issue #19) in the files of `margrpo train`.

    margrpo train-related --method {grpo-mask,maskgrpo,marval-rl} --policy-dir P --suites-dir S \
        --spec-json '<json>' --toyclip-dir T --seed N --out-dir RUN

Methods: `grpo-mask` (plain GRPO with exact log-probs) and `maskgrpo` (MaskGRPO) on a toy-mask policy
(related/maskgrpo/trainer.py); `marval-rl` (reward gradients through a one-step policy, related/marval/rl.py) on
a one-step toy-marval policy. The spec: {"method", "related": MaskGRPOConfig fields (grpo-mask /
maskgrpo; `method` comes from --method) or MARVALRLConfig fields (marval-rl; the reward weights come
from `reward.weights`), "reward": {"name", "weights"}, "reward_models", "sampling" (the policy's:
MaskSamplingConfig fields for toy-mask, the schema's `policies.*.sampling` for marval-rl), "device",
"mixed_precision" (recorded; these methods run in float32)}. Unknown keys are one-line errors.

RUN gets metrics.csv, summary.json (grpo/trainer.py's format: checkpoints with per-prompt validation
scores, base_val_*, variant = the method), spec.json and state/ckpt-XXXXXX/policy at every validation. The trainer
is the method's own (related.method: the run loop's Method, checkpointed by grpo.checkpoints as `margrpo train`):
it resumes a state written under settings that give the same steps (`related.steps` and `related.val_every` may
grow); any other state stops the run naming what differs and deletes nothing, unless `--restart` moves it aside.
SLURM's time limit or a SIGTERM / SIGUSR1 / SIGINT saves and exits with status 75 (infra.stopping); the same
command resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from margrpo.infra.files import InputError
from margrpo.stages._common import prompt_set, run_spec, setup, write_spec
from margrpo.stages._related import METHODS, build_reward, load_any_policy, marval_settings, mask_settings, read_spec

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--method", required=True, choices=sorted(METHODS))
    p.add_argument(
        "--policy-dir",
        required=True,
        help="base policy folder: toy-mask (grpo-mask, maskgrpo) or one-step toy-marval (marval-rl)",
    )
    p.add_argument("--suites-dir", required=True, help="folder with train.jsonl and val.jsonl")
    p.add_argument(
        "--spec-json",
        required=True,
        help="the run's settings: method, related, reward, reward_models, sampling, device, mixed_precision",
    )
    p.add_argument(
        "--toyclip-dir", default=None, help="trained toyclip model (when the reward uses it; marval-rl always does)"
    )
    p.add_argument("--toypref-dir", default=None, help="trained toypref model (when the reward uses it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", required=True, help="run folder: metrics.csv, summary.json, state/ (checkpoints)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--restart",
        action="store_true",
        help="a state/ of other settings, or one that cannot be resumed, is moved to <out-dir>/aside-<time>/ and the "
        "run starts afresh; without it such a run stops with an error naming what differs",
    )


def mask_trainer(args, cfg, sampling, policy, reward, train, val):
    """Plain GRPO or MaskGRPO on a toy-mask policy (related/maskgrpo/trainer.py)."""
    from margrpo.related.maskgrpo.policy import ToyMaskPolicy
    from margrpo.related.maskgrpo.trainer import MaskGRPOTrainer

    if not isinstance(policy, ToyMaskPolicy):
        raise InputError(
            f"{args.policy_dir}: --method {args.method} trains a toy-mask policy, got {type(policy).__name__}"
        )
    if cfg.batch_prompts > len(train):
        raise InputError(
            f"--spec-json: related.batch_prompts ({cfg.batch_prompts}) exceeds the {len(train)} training prompts"
        )
    return MaskGRPOTrainer(policy, reward, train, cfg, val, sampling)


def marval_trainer(args, cfg, sampling, policy, reward, train, val):
    """MARVAL-RL on a one-step policy: toyclip's gradient (and shapes by REINFORCE) with the reward mix's weights,
    validated under the reward mix as `margrpo train` validates (GRPO on the same base shares its base scores)."""
    from margrpo.policy import ToyMAR
    from margrpo.related.marval import MARVALRL

    if not isinstance(policy, ToyMAR) or policy.config.head_sampler != "one_step":
        raise InputError(
            f"{args.policy_dir}: marval-rl trains a one-step policy (written by distill-marval), got "
            f"{type(policy).__name__}"
            + (f" with head_sampler {policy.config.head_sampler!r}" if isinstance(policy, ToyMAR) else "")
        )
    toyclip, shapes = reward.scorers["toyclip"].model, reward.scorers.get("shapes")
    return MARVALRL(policy, toyclip, shapes, train, val, sampling, cfg, val_reward=reward)


def run(args) -> None:
    from margrpo.grpo.checkpoints import flat_record, record_hash
    from margrpo.grpo.run_files import write_run_outputs
    from margrpo.infra.files import refuse_symlink, spec_hash
    from margrpo.infra.run_lock import hold_run_folder
    from margrpo.infra.slurm import segment_header
    from margrpo.infra.stopping import EXIT_RESUMABLE, StopRequest

    print(segment_header(), flush=True)  # heads this run's part of a log that retries append to
    spec = read_spec(args)
    cfg, sampling = (marval_settings if args.method == "marval-rl" else mask_settings)(args, spec)
    device = setup(args.threads, spec.get("device", "auto"))
    out = Path(args.out_dir)
    full_spec = run_spec(spec, args)
    reward = build_reward(spec, args.toyclip_dir, args.toypref_dir)
    suites = Path(args.suites_dir)
    train, val = prompt_set(suites / "train.jsonl"), prompt_set(suites / "val.jsonl")
    build = marval_trainer if args.method == "marval-rl" else mask_trainer
    trainer = build(args, cfg, sampling, load_any_policy(args.policy_dir, device), reward, train, val)
    trainer.desc = f"{args.method}[{args.seed}]"
    config = dataclasses.asdict(cfg)
    # the record, one entry per setting, decides a resume; spec_hash, the key before it, still resumes older states
    record = flat_record({"related": config, "spec": full_spec})
    state_dir = refuse_symlink(out / "state", "state folder")  # a restart moves what is in it
    stop = StopRequest(read_limit=True)  # SLURM's time limit and signals: save and exit resumable
    try:
        with hold_run_folder(state_dir):  # one job per run folder; spec.json once the state is accepted
            trainer.keep_state(
                state_dir,
                record,
                spec_hash({"spec": full_spec, "config": config}),
                args.restart,
                lambda: write_spec(out, full_spec),
            )
            trainer.train(stop)
    finally:
        stop.close()
    if trainer.stopped:
        log.warning(f"stopped at step {trainer.step} of {cfg.steps} ({trainer.stopped}); run again to go on")
        raise SystemExit(EXIT_RESUMABLE)
    write_run_outputs(out, trainer.run, args.method, full_spec, config)
    best = max(trainer.checkpoints, key=lambda c: c["val_reward"])
    log.info(
        f"done: {trainer.step} steps; base val reward {trainer.checkpoints[0]['val_reward']:.4f}; "
        f"best {best['val_reward']:.4f} at step {best['step']} (run {record_hash(record)})"
    )
