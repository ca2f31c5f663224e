"""`margrpo train`: one GRPO run (a variant of the ladder, a reward setting, a seed)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from functools import partial
from pathlib import Path

from margrpo.infra.process_group import leave_at_exit, leave_process_group
from margrpo.stages._common import (
    json_arg,
    prompt_set,
    reward_options,
    run_spec,
    setup,
    write_spec,
)

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy-dir", required=True, help="base policy folder (or policy.json pointer)")
    p.add_argument("--suites-dir", required=True, help="folder with train.jsonl and val.jsonl")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--spec-json",
        help="the run's resolved settings (margrpo.experiment.config.train_spec), as passed by Snakemake",
    )
    src.add_argument("--config", help="an experiment YAML (by hand); needs --policy, --reward, --variant")
    p.add_argument("--policy"), p.add_argument("--reward"), p.add_argument("--variant")
    p.add_argument("--toyclip-dir", default=None, help="trained toyclip model (when the reward uses it)")
    p.add_argument("--toypref-dir", default=None, help="trained toypref model (when the reward uses it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", required=True, help="run folder: metrics.csv, summary.json, state/ (checkpoints)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--restart",
        action="store_true",
        help="when state/ holds a run these settings cannot resume (or cannot be read), move it to "
        "<out-dir>/aside-<time>/ and start afresh; without it such a run stops with an error naming what differs",
    )
    p.add_argument(
        "--requeues",
        type=int,
        default=20,
        help="inside SLURM, a planned stop (the time limit drawing near, the warning signal, a preemption) requeues "
        "the job under its id up to this many times (the config's slurm.requeues); a `scancel` does not; 0: it "
        "exits with status 75",
    )


def _read_spec(args) -> dict:
    """The run's spec as given: the `--spec-json` Snakemake passes, or the train spec of --policy, --reward and
    --variant in the `--config` given by hand. `run` checks it (experiment.settings)."""
    from margrpo.experiment.config import load_config, train_spec

    if args.spec_json:
        return json_arg(args.spec_json, "--spec-json")
    if not (args.policy and args.reward and args.variant):
        raise SystemExit("--config needs --policy, --reward and --variant")
    return train_spec(load_config(args.config), args.policy, args.reward, args.variant)


def run(args) -> None:
    from margrpo.infra.slurm import refuse_cancelled_retry, segment_header
    from margrpo.infra.stopping import StopRequest

    main = os.environ.get("RANK", "0") == "0"
    if "RANK" not in os.environ:  # one process; the launcher heads a job of several
        print(segment_header(), flush=True)
    refuse_cancelled_retry(Path(args.out_dir), remove=main)
    # the stop's handlers from before the model is built until after the last collective: a signal saves, never
    # ends a process of the job with 143 (the main process reads SLURM's time limit)
    stop = StopRequest(read_limit=main)
    leave_at_exit()  # after an error too, the process groups go before the interpreter (issue 81)
    try:
        _build_and_train(args, stop)
        leave_process_group()
    finally:
        stop.close()


def _build_and_train(args, stop) -> None:
    from margrpo.experiment.settings import train_settings
    from margrpo.grpo.parallel import build_policy
    from margrpo.grpo.trainer import GRPOTrainer
    from margrpo.policy import load_policy
    from margrpo.rewards import build_reward_mix

    spec = _read_spec(args)
    device = setup(args.threads, spec.get("device", "auto"), data_parallel=True)  # names a stray WORLD_SIZE first
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # where the cluster binds tasks to CPUs: this process's share
        cpus = len(os.sched_getaffinity(0))
        print(f"margrpo: process {os.environ['RANK']} on {os.uname().nodename} holds {cpus} CPUs", flush=True)
    # the dry run's checks of a variant, here on the spec itself: a run by hand passes the same ones
    what = "--spec-json" if args.spec_json else args.config
    named = "" if args.spec_json else f" (variant {args.variant!r})"

    def key(k: str) -> str:
        return f"grpo.{k}{named}"

    suites = Path(args.suites_dir)
    val_prompts = prompt_set(suites / "val.jsonl")
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    settings = train_settings(spec, what, processes, len(val_prompts), suites / "val.jsonl", key)
    cfg = settings.grpo
    cfg.seed = args.seed
    out = _writable(Path(args.out_dir))
    full_spec = run_spec(settings.spec, args)
    weights = settings.reward_weights
    reward = build_reward_mix(
        weights, reward_options(weights, settings.reward_models, args.toyclip_dir, args.toypref_dir)
    )
    # under FSDP the main process alone reads the weights (grpo.parallel.build_policy)
    policy = build_policy(lambda: load_policy(args.policy_dir, device), settings.policy.sharding)
    trainer = GRPOTrainer(
        policy,
        reward,
        prompt_set(suites / "train.jsonl"),
        val_prompts,
        settings.sampling,
        cfg,
        out,
        device=device,
        policy_settings=settings.policy,
    )
    # spec.json once the run folder's lock is held and its state accepted: a refused run leaves it as it was
    trainer.checkpointer.on_accept = partial(write_spec, out, full_spec)  # called on the main process
    _train_or_stop(trainer, full_spec, stop, args.restart, args.requeues)
    if not trainer.engine.is_main:  # data parallel: one process writes the run's files
        return
    trainer.write_outputs(full_spec)
    best = max(trainer.checkpoints, key=lambda c: c["val_reward"])
    ema = (
        f" (EMA weights, decay {cfg.ema_decay})" if cfg.ema_decay else ""
    )  # summary.json's config.ema_decay says the same
    log.info(
        f"done: {trainer.step} steps; base val reward {trainer.checkpoints[0]['val_reward']:.4f}; "
        f"best {best['val_reward']:.4f}{ema} at step {best['step']}"
    )


def _writable(out: Path) -> Path:
    """The run folder, made if need be; one that cannot be written is an error naming it, not a writer's traceback."""
    from margrpo.infra.files import InputError

    try:
        (out / "state").mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"{out}: the run folder cannot be made ({err.strerror})") from None
    for folder in (out, out / "state"):
        if not os.access(folder, os.W_OK | os.X_OK):
            raise InputError(f"{folder}: the run folder is not writable by this user; a train job writes there")
    return out


def _train_or_stop(trainer, spec: dict, stop, restart: bool = False, requeues: int = 0) -> None:
    """Train to the end, or save where SLURM's time limit draws near or the job is told to stop (infra.stopping):
    then, inside SLURM, requeue the job if the stop was planned (at most `requeues` times a job), note a `scancel`
    as deliberate (infra.slurm.after_stop), else exit with EXIT_RESUMABLE; the same command resumes."""
    from margrpo.infra.run_lock import hold_run_folder
    from margrpo.infra.slurm import after_stop, wait_to_be_ended
    from margrpo.infra.stopping import EXIT_RESUMABLE

    # one job per run folder: the main process holds state/'s lock (its other processes are the same job)
    held = hold_run_folder(trainer.state_dir) if trainer.engine.is_main else contextlib.nullcontext()
    with held:
        trainer.train(spec, stop, restart)
    if trainer.stopped:
        log.warning(
            f"stopped at step {trainer.step} of {trainer.cfg.steps} ({trainer.stopped}{stop.since_signal()}); "
            "run again to go on"
        )
        # inside SLURM the main process decides what follows from the job's state; a requeued job's processes
        # wait for SLURM to end it, so no level reads the stop as a failure
        main = trainer.engine.is_main
        then = trainer.engine.from_main(after_stop(requeues, trainer.out_dir, trainer.step) if main else None)
        leave_process_group()
        if then == "requeued":
            wait_to_be_ended()
        raise SystemExit(EXIT_RESUMABLE)
