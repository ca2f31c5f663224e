"""Run by tests/test_data_parallel.py as W processes: tiny GRPO runs on the gloo backend.

`python -m margrpo.infra.launch W python dp_worker.py MODE OUT` (torchrun's environment):
  first-update OUT  one GRPO step of each variant; rank 0 saves the parameters and the logged row
  train OUT         a 4-step run in OUT/run (save_every 2), recording every file each process writes;
                    with KILL_AT_STEP=s, rank 1 is SIGKILLed in the middle of step s; with STOP_AT_STEP=s, every
                    process has a stop request and rank 1 alone is sent SIGTERM as AR step 2 of step s begins
THREADS_AT_EXIT=DIR: each process writes the process-group threads it still runs at exit (DIR/threads-rankR.json);
FAIL_AT_END=1: each process raises after its work instead of leaving the process group
"""

import atexit
import builtins
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from helpers import KillAt, StopAt, make_trainer, tiny_policy  # noqa: E402

VARIANTS = {
    "grpo": {},
    "fix": {"freeze_head": True},
    "mte-sim": {"freeze_head": True, "trajectories": 3, "sim": True},
    "lora": {"freeze_head": True, "lora": {"rank": 4, "alpha": 8}},
    "chunked": {"freeze_head": True, "replay_chunk": 1},
    "checkpointed": {"gradient_checkpointing": True, "replay_chunk": 1},
}  # blocks recomputed inside FSDP's groups
META = bool(os.environ.get("META"))  # build the policy on the main process alone (grpo.parallel.build_policy)
SHARDING = os.environ.get("SHARDING", "replicate")  # grpo.parallel: DDP, or FSDP2's two shardings
POLICY = os.environ.get("POLICY", "toy")  # the tiny toy, NOVA or Harmon of the tests
PRECISION = os.environ.get("PRECISION", "no")  # mixed precision of the first updates (bf16: FSDP casts, DDP autocasts)
ONLY = os.environ.get("ONLY")  # the variants to run, comma-separated (default: all)


def make_policy():
    if POLICY == "nova":
        from builders_policies import tiny_nova

        return tiny_nova(seed=1)
    if POLICY == "harmon":
        from builders_policies import tiny_harmon

        return tiny_harmon(seed=1)
    return tiny_policy("flow", seed=1)


def first_update(out: Path) -> None:
    from margrpo.grpo.parallel import build_policy

    results, loads, metas = {}, [], {}
    for name, variant in VARIANTS.items():
        if ONLY and name not in ONLY.split(","):
            continue
        if POLICY == "harmon" and "lora" in variant:  # Harmon's LoRA adapts the LLM, which the paper config freezes
            continue
        # micro_batches is per process: 4 of 1 image each in one process, 2 of 1 in each of two: the same split
        micro = 4 // int(os.environ["WORLD_SIZE"])
        frozen = ("llm.", "proj_in.", "proj_out.") if POLICY == "harmon" else ()  # the paper config's rl_frozen
        if META:  # the others receive the main process's structure on the meta device, their shards later
            policy = build_policy(lambda name=name: (loads.append(name), make_policy())[1], SHARDING)
            meta = [n for n, p in policy.named_parameters() if p.is_meta]
        else:
            policy, meta = make_policy(), []
        trainer = make_trainer(
            out / name,
            policy=policy,
            device="cpu",
            trackers=[],
            micro_batches=micro,
            sharding=SHARDING,
            precision=PRECISION,
            frozen=frozen,
            **variant,
        )
        accumulated = record_micro_batch_grads(trainer) if trainer.engine.world == 1 else []
        row = trainer.train_step()
        micro_grads = [a - (accumulated[i - 1] if i else 0) for i, a in enumerate(accumulated)]  # each micro-batch's
        whole = trainer.engine.full_tensors  # FSDP's shards gathered (every process takes part)
        params = whole(dict(trainer.policy.named_parameters()))
        grads = whole(
            {n: p.grad for n, p in trainer.policy.named_parameters() if p.grad is not None}
        )  # summed over processes
        results[name] = {
            "params": list(params.values()),
            "grads": list(grads.values()),
            "row": {k: v for k, v in row.items() if isinstance(v, float)},
            "micro_grads": micro_grads,
        }
        metas[name] = len(meta)
    if trainer.engine.is_main:
        torch.save(results, out / "first_update.pt")
    # which variants' policies this process built, and how many of its parameters started on the meta device
    (out / f"built-rank{trainer.engine.rank}.json").write_text(json.dumps({"loads": loads, "meta": metas}))


def record_micro_batch_grads(trainer) -> list[torch.Tensor]:
    """The probe's parameters' accumulated gradient (float64, flat) after each micro-batch, filled as one process
    runs its step."""
    accumulated, probe = [], trainer.probe
    after = probe.after_micro_batch

    def recording(last: bool) -> None:
        flat = [(p.grad if p.grad is not None else torch.zeros_like(p)).double().flatten() for p in probe.params]
        accumulated.append(torch.cat(flat))
        after(last)

    probe.after_micro_batch = recording
    return accumulated


def record_writes(rank: int) -> list[str]:
    """Every file or folder this process creates, renames, saves or removes (after this call)."""
    writes: list[str] = []
    real_open, real_replace, real_rename, real_save, real_rmtree = (
        builtins.open,
        os.replace,
        Path.rename,
        torch.save,
        shutil.rmtree,
    )
    real_mkdir, real_path_open = Path.mkdir, Path.open

    def open_(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+"):
            writes.append(f"open {file}")
        return real_open(file, mode, *a, **k)

    def mkdir(self, *a, **k):
        if not self.exists():
            writes.append(f"mkdir {self}")
        return real_mkdir(self, *a, **k)

    def path_open(self, mode="r", *a, **k):
        if any(c in mode for c in "wax+"):
            writes.append(f"open {self}")
        return real_path_open(self, mode, *a, **k)

    def save(obj, f, *a, **k):  # into a file by name (a stream's file was recorded when it was opened)
        if isinstance(f, (str, os.PathLike)):
            writes.append(f"save {f}")
        return real_save(obj, f, *a, **k)

    builtins.open = open_
    Path.open = path_open
    os.replace = lambda a, b: (writes.append(f"replace {b}"), real_replace(a, b))[1]
    Path.rename = lambda self, t: (writes.append(f"rename {t}"), real_rename(self, t))[1]
    torch.save = save
    shutil.rmtree = lambda p, *a, **k: (writes.append(f"rmtree {p}"), real_rmtree(p, *a, **k))[1]
    Path.mkdir = mkdir
    return writes


def train(out: Path) -> None:
    kill_at = int(os.environ.get("KILL_AT_STEP", "0"))
    ema = float(os.environ["EMA"]) if os.environ.get("EMA") else None  # grpo.ema_decay
    rank = int(os.environ["RANK"])  # torchrun's (margrpo.infra.launch)
    # process 1 dies (SIGKILL) as step `kill_at` begins
    dies = KillAt(kill_at - 1, lambda: os.kill(os.getpid(), signal.SIGKILL)) if kill_at and rank == 1 else None
    stop_at = int(os.environ.get("STOP_AT_STEP", "0"))
    if stop_at and rank == 1:  # the one process told to stop, in mid-rollout
        dies = StopAt(stop_at - 1, ar_step=2)
    trainer = make_trainer(
        out / "run",
        policy=tiny_policy("flow", seed=1),
        steps=4,
        save_every=2,
        val_every=2,
        sharding=SHARDING,
        ema_decay=ema,
        lora={"rank": 4, "alpha": 8} if os.environ.get("LORA") else None,
        hooks=dies,
    )
    assert rank == trainer.engine.rank
    writes = record_writes(rank)
    from margrpo.infra.stopping import StopRequest

    stop = StopRequest(read_limit=False) if stop_at else None
    try:
        trainer.train({"seed": 0}, stop)
    finally:
        if stop:
            stop.close()
    if trainer.engine.is_main:
        trainer.write_outputs({"variant": {"name": "grpo"}})
    recorded = list(writes)  # the run's own writes: what the test's file below is not
    if stop_at:
        (out / f"stopped-rank{rank}.json").write_text(json.dumps({"stopped": trainer.stopped, "step": trainer.step}))
    torch.save(
        list(trainer.engine.full_tensors(dict(trainer.policy.named_parameters())).values()),
        out / f"params-rank{rank}.pt",
    )
    (out / f"writes-rank{rank}.json").write_text(json.dumps(recorded))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    torch.set_num_threads(1)
    mode, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    from margrpo.infra.process_group import backend_threads, leave_at_exit, leave_process_group
    from margrpo.stages._common import setup

    if os.environ.get("THREADS_AT_EXIT"):  # after leave_at_exit's handler (atexit runs the last registered first)
        at_exit = Path(os.environ["THREADS_AT_EXIT"]) / f"threads-rank{os.environ['RANK']}.json"
        atexit.register(lambda: at_exit.write_text(json.dumps(backend_threads())))
    leave_at_exit()  # as `margrpo train` does
    setup(1, "cpu", data_parallel=True)  # as `margrpo train` does, before the policy is built
    {"first-update": first_update, "train": train}[mode](out)
    if os.environ.get("FAIL_AT_END"):  # an error after the work: the process ends without leaving the group
        raise RuntimeError("FAIL_AT_END")
    leave_process_group()  # as `margrpo train` does
