"""How long a periodic checkpoint holds training up: the checkpointer's save written at once against one written
behind the next steps (torch.distributed.checkpoint.async_save: the training state copied to CPU memory, then
written by a thread), on a toy policy whose training state (weights and AdamW's two moments) is `--gib` GiB.

Prints, per repeat and as medians: the stall of each (the time `Checkpointer.save` holds the caller), the time a
background save takes until it is on disk, and the ratio of the two stalls, measured in one run. The policy folder
(safetensors) is written at once in both: the stall a background save leaves is the folder plus the CPU copy.

    python benchmarks/save_stall.py --gib 1 --repeats 3 --out save_stall.json
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from margrpo.infra.kernels import apply_caps

apply_caps()
import torch  # noqa: E402

from margrpo.grpo.checkpoints import Checkpointer  # noqa: E402
from margrpo.grpo.engine import Engine  # noqa: E402
from margrpo.policy import ToyMAR, ToyMARConfig  # noqa: E402


def policy_of(gib: float) -> ToyMAR:
    """A toy policy whose weights and AdamW's two moments take at least `gib` GiB (12 bytes a parameter)."""
    width = 128
    while True:
        policy = ToyMAR(ToyMARConfig(width=width, depth=8, heads=8, head_width=width, head_depth=4))
        if 12 * sum(p.numel() for p in policy.parameters()) >= gib * 2**30:
            return policy
        width += 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    policy = policy_of(args.gib)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    for p in policy.parameters():  # AdamW's moments exist, as in a run
        p.grad = torch.zeros_like(p)
    optimizer.step()
    state_gib = 12 * sum(p.numel() for p in policy.parameters()) / 2**30
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        ckpt = Checkpointer(policy, optimizer, Engine(policy, torch.device("cpu")), Path(d) / "state")
        (Path(d) / "state").mkdir()
        step = 0
        for _ in range(args.repeats):
            for background in (False, True):
                step += 1
                started = time.monotonic()
                ckpt.save(step, {"rows": [], "checkpoints": []}, background)
                stall = time.monotonic() - started
                ckpt.finish()
                rows.append({"background": background, "stall_s": stall, "on_disk_s": time.monotonic() - started})
    at_once = [r["stall_s"] for r in rows if not r["background"]]
    behind = [r["stall_s"] for r in rows if r["background"]]
    behind_disk = [r["on_disk_s"] for r in rows if r["background"]]
    report = {
        "state_gib": state_gib,
        "rows": rows,
        "median_stall_at_once_s": statistics.median(at_once),
        "median_stall_behind_s": statistics.median(behind),
        "median_behind_on_disk_s": statistics.median(behind_disk),
        "stall_ratio_behind_over_at_once": statistics.median(behind) / statistics.median(at_once),
    }
    print(f"training state {state_gib:.2f} GiB (+ the policy folder, {state_gib / 3:.2f} GiB)")
    for r in rows:
        kind = "behind " if r["background"] else "at once"
        print(f"  {kind}: stall {r['stall_s']:6.2f} s, on disk after {r['on_disk_s']:6.2f} s")
    print(
        f"median stall: at once {report['median_stall_at_once_s']:.2f} s, behind {report['median_stall_behind_s']:.2f}"
        f" s (ratio {report['stall_ratio_behind_over_at_once']:.2f}); behind, on disk after"
        f" {report['median_behind_on_disk_s']:.2f} s"
    )
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
