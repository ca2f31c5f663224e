"""Per-step cost of grpo.trackers: ["tensorboard"] (the default) on the tiny test policy, in one run.

Two trainers of the same settings, one with the TensorBoard tracker and one without, take their steps
in turn (CPU time of this one-thread process, so other work on a shared machine does not enter); the
difference per step is the tracker's cost: one accelerator.log of the metrics row per step, and a
validation image grid every `val_every` steps. The writer's start-up (importing torch.utils.tensorboard
and opening the event file) is paid once per run and printed apart.

    python benchmarks/tracker_overhead.py [--steps 20] [--val-every 10]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import make_trainer, tiny_policy  # noqa: E402

from margrpo.infra.trackers import end_trackers, log_image_grid, start_trackers  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--val-every", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    kw = dict(steps=args.steps, val_every=args.val_every, save_every=10**6)
    runs = {
        name: make_trainer(tmp / name, policy=tiny_policy("flow", seed=1), trackers=trackers, **kw)
        for name, trackers in (("plain", ()), ("tensorboard", ("tensorboard",)))
    }
    t0 = time.process_time()
    start_trackers(runs["tensorboard"].accelerator, tmp / "tensorboard/tb", "grpo", None, wandb={})
    startup = time.process_time() - t0
    cost, own = {name: 0.0 for name in runs}, 0.0
    for _ in range(args.steps):  # in turn: step, then what train() adds per step (log; at validation, the grid)
        for name, t in runs.items():
            t0 = time.process_time()
            row = t.train_step()
            if t.step % args.val_every == 0:
                t.validate()
            t1 = time.process_time()
            t.accelerator.log(
                {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}, step=t.step
            )
            if t.step % args.val_every == 0 and t.accelerator.trackers:  # the grid validate() logs, once more
                log_image_grid(t.accelerator, "bench/grid", torch.rand(2, 3, 64, 64), t.step)
            own += time.process_time() - t1 if t.accelerator.trackers else 0.0
            cost[name] += time.process_time() - t0
    end_trackers(runs["tensorboard"].accelerator)
    plain, tb = (cost[n] / args.steps for n in ("plain", "tensorboard"))
    print(f"tracker start-up (once per run): {1e3 * startup:.1f} ms CPU")
    print(
        f"per step: {1e3 * plain:.1f} ms without, {1e3 * tb:.1f} ms with TensorBoard: "
        f"{1e3 * (tb - plain):+.2f} ms ({100 * (tb / plain - 1):+.1f}%), validation every {args.val_every} steps"
    )
    print(
        f"the tracker's own calls: {1e3 * own / args.steps:.2f} ms per step "
        f"({100 * own / args.steps / plain:.2f}% of a step)"
    )


if __name__ == "__main__":
    main()
