"""Run by test_ratio_kernels.py in a fresh process, whose environment picks the kernels (ATEN_CPU_CAPABILITY,
MKL_CBWR and the thread count are read at start-up): the default toys' rollout (default_toys.py, the one
test_toy_proportions.py checks) replayed at every (AR step, diffusion step), committed and MTE trajectories.
Prints one JSON line: the kernel capability torch runs with and, per toy, max |ratio - 1| of each.

    python tests/ratio_worker.py [THREADS]   (default 1, as the tests run)
"""

import json
import sys

import torch
from default_toys import TOYS, default_toy_rollout
from helpers import replayed_ratios


def deviation(name: str) -> tuple[float, float]:
    with torch.no_grad():
        _, ratio, mte_ratio = replayed_ratios(*default_toy_rollout(name))
    return float(ratio.sub(1).abs().max()), float(mte_ratio.sub(1).abs().max())


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    print(
        json.dumps(
            {
                "capability": torch.backends.cpu.get_cpu_capability(),
                "threads": torch.get_num_threads(),
                **{name: deviation(name) for name in TOYS},
            }
        )
    )
