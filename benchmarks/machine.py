"""The machine a timing was taken on, and its speed on a fixed workload that does not depend on margrpo's code.

Timings of the default run are only comparable on the same machine on the same day (docs/findings.md, "How long
does the default run take?"): hosts of one kind have differed 2-2.5x per CPU second. Run this beside a timing and
report both: the CPU (model, instruction sets, caches, from lscpu) and the time of

- `matmul`: one-thread fp32 1024 x 1024 x 1024 products (GFLOP/s, the median of 20 after 3 warm-ups);
- `train`: one-thread forward and backward passes of a fixed small convolutional net and MLP defined here
  (16 x 3 x 64 x 64 images, the toy's image size), with an SGD step, seeded (ms a step, the median of 20).

    python benchmarks/machine.py [--json OUT]      (a few seconds)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time


def cpu() -> dict:
    """Model, instruction sets of note and caches, as lscpu reports them (else /proc/cpuinfo's model name)."""
    info: dict = {"machine": platform.machine()}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    info["model"] = fields.get("Model name", "")
    info["cores"] = fields.get("CPU(s)", "")
    info["threads_per_core"] = fields.get("Thread(s) per core", "")
    flags = set(fields.get("Flags", "").split())
    info["isa"] = [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    info["caches"] = {k: fields[k] for k in ("L1d cache", "L2 cache", "L3 cache") if k in fields}
    info["hypervisor"] = fields.get("Hypervisor vendor", "")
    return info


def _median_time(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_gflops(n: int = 1024, repeats: int = 20) -> float:
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    return 2 * n**3 / _median_time(lambda: torch.mm(a, b), repeats) / 1e9


def train_step_ms(repeats: int = 20) -> float:
    import torch
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        nn.GELU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.GELU(),
        nn.Flatten(),
        nn.Linear(64 * 16 * 16, 256),
        nn.GELU(),
        nn.Linear(256, 1),
    )
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x, y = torch.rand(16, 3, 64, 64), torch.rand(16, 1)

    def step():
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(net(x), y).backward()
        opt.step()

    return _median_time(step, repeats) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    cpu_start = time.process_time()
    result = {
        "cpu": cpu(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "matmul_gflops_1thread": round(matmul_gflops(), 1),
        "train_step_ms_1thread": round(train_step_ms(), 2),
    }
    result["cpu_seconds"] = round(time.process_time() - cpu_start, 1)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
