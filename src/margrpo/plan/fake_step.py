"""A full-size step planned: the tape recorded on the narrow twin, then the fake step, each in a child process of
its own (`isolated`)."""

from __future__ import annotations

import sys

from margrpo.plan import ledger
from margrpo.plan.composition import PHASES
from margrpo.plan.ledger import GiB
from margrpo.plan.step import Run, Step, measure


def plan_step(run: Run, steps: int | None, say=print) -> Step:
    """Record the tape on the narrow twin, then take the fake full-size step."""
    if ledger.saying_phases():
        print(f"  {run.policy} {run.variant} [{run.label()}]: recording on the narrow twin ...", flush=True)
    rec = isolated(measure, run, False, True, None, steps)
    if ledger.saying_phases():
        print(f"    recorded {len(rec.tape)} values ({rec.seconds:.0f} s); the fake step ...", flush=True)
    step = isolated(measure, run, True, False, rec.tape, steps)
    step.seconds, step.cpu_seconds = step.seconds + rec.seconds, step.cpu_seconds + rec.cpu_seconds
    K, R = step.ar_steps
    say(
        f"  {run.policy} {run.variant} [{run.label()}]: {len(rec.tape)} recorded values, "
        f"rollout of {R} of {K} AR steps; "
        + ", ".join(f"{p} {step.peaks[p][0] / GiB:.1f} GiB" for p in PHASES)
        + f" of tensors ({step.seconds:.0f} s)"
    )
    return step


def _child(fn, args: tuple, queue) -> None:
    import faulthandler
    import os

    faulthandler.enable()
    out = fn(*args)
    if isinstance(out, Step) and out.fake:
        out.tape = []  # a fake step's tape is the one it was given
    queue.put(out)
    queue.close()
    queue.join_thread()
    sys.stdout.flush()
    os._exit(0)  # no exit handlers: the answer is out


def preload() -> None:
    """What every step imports, imported once before the children are forked."""
    import importlib

    for name in (
        "accelerate",
        "margrpo.experiment.config",
        "margrpo.grpo.trainer",
        "margrpo.policy.nova",
        "margrpo.policy.harmon",
        "diffusers.models.autoencoders.autoencoder_kl",
        "transformers.models.phi.modeling_phi",
        "transformers.models.qwen2.modeling_qwen2",
    ):
        importlib.import_module(name)


def isolated(fn, *args, retries: int = 2, fresh: bool = False):
    """fn(*args) in a child process (forked: nothing to import again), so that each measured step starts from
    this process's clean state: after a step had run, building the next policy in the same process died of a
    segfault now and then (in transformers' PhiModel init, inside `re` / `packaging`; never in a plain trainer;
    the cause is open), and a real step's resident set then counts that step alone. A child that dies without
    an answer is run again (`retries` times), and said so. `fresh`: a new interpreter instead (spawned), whose
    resident set holds nothing of this one's."""
    import multiprocessing as mp
    import queue as queues

    ctx = mp.get_context("fork" if sys.platform == "linux" and not fresh else "spawn")
    for attempt in range(retries + 1):
        answers = ctx.Queue()
        child = ctx.Process(target=_child, args=(fn, args, answers))
        child.start()
        while True:
            try:
                out = answers.get(timeout=1)
                child.join()
                return out
            except queues.Empty:
                if not child.is_alive():
                    break
        print(
            f"  (the process for {fn.__name__} exited with code {child.exitcode} and no answer; "
            f"{'running it again' if attempt < retries else 'giving up'})",
            flush=True,
        )
    raise RuntimeError(f"{fn.__name__}: every process died")
