"""What reducing every replayed chunk costs under FSDP `full_shard`, against reducing once per micro-batch.

A chunked replay (`grpo.replay_chunk`) backpropagates the |M| chosen AR steps a few at a time. FSDP can
reduce-scatter each chunk's gradient at once, so every process holds only its 1/N shard of the gradients through
the replay (`FSDPEngine.reduce_each_chunk`, the default), or accumulate the chunks' whole gradients locally and
reduce-scatter once, after the last (one collective per micro-batch instead of |M| / chunk). Two processes
(torchrun, gloo, one thread each) take the same GRPO steps of the toy both ways; per way: the median step time
(wall and this process's CPU time), the reduce-scatters of one step, and the CPU allocator's peak growth during
a step as torch's profiler records it (a further, profiled step); with the gradient-variance probe on
(`grpo.grad_variance`: a snapshot of this process's shards of the AR's gradient between micro-batches,
grpo.grad_stats) and off. The reward is a cheap stand-in (mean brightness). The first updates of the two ways
agree (printed): the choice changes where the gradient waits, not what it is.

    python benchmarks/chunk_reduction.py [--config config/config.yaml] [--steps 4] [--model '{"depth": 12}']
        [--grpo '{"mask_steps": 4, "batch_prompts": 2, "group_size": 2, "micro_batches": 2}']
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from grpo_step import MODEL, PROMPTS, make_trainer  # noqa: E402

from margrpo.experiment.config import load_config  # noqa: E402
from margrpo.grpo.rollout import SamplingConfig  # noqa: E402
from margrpo.plan.step import allocator_record  # noqa: E402


def counted_reduce_scatters(policy: torch.nn.Module) -> list:
    """A list that gets an entry at each of FSDP2's reduce-scatters of `policy`'s groups: its default communication,
    set on every group through FSDP's own hook (`set_custom_reduce_scatter`)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter

    calls = []

    class Counted(DefaultReduceScatter):
        def __call__(self, *args, **kwargs):
            calls.append(1)
            return super().__call__(*args, **kwargs)

    for module in policy.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_reduce_scatter(Counted())
    return calls


def worker(args) -> None:
    """One process: `steps` timed steps after a warm-up, then one profiled step; rank 0 prints JSON."""
    from margrpo.grpo.engine import join_process_group

    torch.set_num_threads(1)
    join_process_group("cpu")
    MODEL.update(json.loads(args.model))
    config = load_config(args.config)
    name = config["experiments"]["ladder"]["policies"][0]
    sampling = SamplingConfig(**config["policies"][name]["sampling"])
    world = int(os.environ["WORLD_SIZE"])
    grpo = {
        **config["grpo"],
        "precision": "no",
        "sharding": "full_shard",
        "replay_chunk": 1,
        "val_every": 10_000,
        "save_every": 10_000,
        "trackers": [],
        "micro_batches": max(1, config["grpo"]["micro_batches"] // world),
        **json.loads(args.grpo),
        "grad_variance": not args.no_probe,
    }
    trainer = make_trainer(None, sampling, grpo, {}, args.steps + 1, prompts=PROMPTS * 4)
    trainer.engine.reduce_each_chunk = args.each_chunk  # this engine's choice (FSDPEngine.reduce_each_chunk)
    calls = counted_reduce_scatters(trainer.policy)
    walls, cpus, per_step, first = [], [], [], None
    for _ in range(args.steps + 1):
        calls.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.train_step()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        per_step.append(len(calls))
        first = first or trainer.engine.full_tensors(dict(trainer.policy.named_parameters()))
    with allocator_record(True) as peak, torch.profiler.record_function("step"):
        trainer.train_step()
    trained = sum(p.numel() * p.element_size() for p in first.values() if p.dtype.is_floating_point)
    if trainer.engine.is_main:
        torch.save({k: v.detach() for k, v in first.items()}, args.out)
        result = {
            "each_chunk": args.each_chunk,
            "probe": not args.no_probe,
            "wall_s": statistics.median(walls[1:]),
            "cpu_s": statistics.median(cpus[1:]),
            "reduce_scatters": per_step[-1],
            "allocated_peak": peak[0],
            "policy_bytes": trained,
            "mask_steps": grpo["mask_steps"],
            "images": grpo["batch_prompts"] * grpo["group_size"],
        }
        print("RESULT " + json.dumps(result))


def launch(each_chunk: bool, probe: bool, args, out: Path) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__, "--worker"]
    cmd += ["--config", args.config, "--steps", str(args.steps), "--model", args.model, "--grpo", args.grpo]
    cmd += ["--out", str(out)] + (["--each-chunk"] if each_chunk else []) + ([] if probe else ["--no-probe"])
    run = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if run.returncode:
        raise SystemExit(run.stderr[-3000:])
    return json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--model", default="{}", help="ToyMARConfig overrides (random init) as JSON")
    p.add_argument(
        "--grpo",
        default='{"mask_steps": 4, "batch_prompts": 2, "group_size": 2, "micro_batches": 2}',
        help="grpo overrides as JSON (default: a small batch, so that the gradients weigh; the probe needs two "
        "micro-batches a process)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--each-chunk", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    import tempfile

    mib, results = 2**20, {}
    with tempfile.TemporaryDirectory() as tmp:
        for probe in (True, False):
            for each in (False, True):
                out = Path(tmp) / f"{probe}-{each}.pt"
                results[probe, each] = launch(each, probe, args, out), torch.load(out)
    one = results[True, False][0]
    print(
        f"FSDP full_shard, 2 processes x 1 thread, {os.cpu_count()} cores; toy {one['policy_bytes'] / mib:.1f} MiB of "
        f"fp32 parameters; {one['images']} images a step, |M| = {one['mask_steps']}, replay_chunk 1"
    )
    for probe in (True, False):
        (once, a), (each, b) = results[probe, False], results[probe, True]
        print(f"gradient-variance probe {'on' if probe else 'off'}:")
        for r in (once, each):
            way = "every chunk" if r["each_chunk"] else "last chunk "
            print(
                f"  reduce at {way}: median step {r['wall_s']:.3f} s wall, {r['cpu_s']:.3f} s CPU; "
                f"{r['reduce_scatters']} reduce-scatters a step; allocator peak growth "
                f"{r['allocated_peak'] / mib:.1f} MiB"
            )
        diff = max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-12)) for k in a)  # first update
        print(
            f"  every chunk / last chunk: time {each['wall_s'] / once['wall_s']:.3f} (wall), "
            f"{each['cpu_s'] / once['cpu_s']:.3f} (CPU); peak {each['allocated_peak'] / once['allocated_peak']:.3f} "
            f"({(each['allocated_peak'] - once['allocated_peak']) / mib:+.1f} MiB); first update: largest relative "
            f"difference {diff:.1e}"
        )


if __name__ == "__main__":
    main()
