"""The machine a timing was taken on, and its speed on a fixed workload that does not depend on margrpo's code.

Timings of the default run are only comparable on the same machine on the same day (docs/findings.md, "How long
does the default run take?"): hosts of one kind have differed 2-2.5x per CPU second. Run this beside a timing and
report both: the CPU (model, instruction sets, caches, from lscpu) and the time of

- `matmul`: one-thread fp32 1024 x 1024 x 1024 products (GFLOP/s, the median of 20 after 3 warm-ups);
- `train`: one-thread forward and backward passes of a fixed small convolutional net and MLP defined here
  (16 x 3 x 64 x 64 images, the toy's image size), with an SGD step, seeded (ms a step, the median of 20);
- `mix` (issue 58): what a default run's jobs do, as they do it: two processes at once (the run's `--cores 2`),
  one thread each, under margrpo's kernel caps (MKL_CBWR=AVX2,STRICT ...: the first two numbers run on the CPU's
  native paths, which on an AVX-512 Xeon are not the paths a run takes), each repeating a fixed toy-sized GRPO
  step defined here: a 4-block transformer of width 192 over 48 positions for 24 images, then 20 calls of a
  width-64 AdaLN MLP head on the 16 x 24-channel tokens with a sampler's per-channel arithmetic, forward and
  backward (ms a step per process, the median of 10; and its CPU ms).

    python benchmarks/machine.py [--json OUT]      (about half a minute)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


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


def mix_step(repeats: int = 10) -> dict:
    """One process's part of `mix`: a fixed toy GRPO step (AR transformer, then a light head's diffusion loop)."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)
    width, head, channels, tokens, images = 192, 64, 24, 16, 24
    ar = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(width, 6, 4 * width, dropout=0.0, batch_first=True, norm_first=True),
        4,
        enable_nested_tensor=False,
    )
    cond, body = nn.Linear(width, 2 * head), nn.Sequential(nn.Linear(channels, head), nn.SiLU(), nn.Linear(head, head))
    out = nn.Linear(head, 2 * channels)
    norm = nn.LayerNorm(head, elementwise_affine=False)
    params = [*ar.parameters(), *cond.parameters(), *body.parameters(), *out.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    seq, noise = torch.randn(images, 48, width), torch.randn(20, images * tokens, channels)

    def step():
        opt.zero_grad(set_to_none=True)
        z = ar(seq)[:, :tokens].reshape(-1, width)
        scale, shift = cond(z).chunk(2, dim=-1)
        x, logp = noise[0], 0.0
        for t in range(1, 20):  # the sampler: per-channel mean and variance, a Gaussian log-prob per step
            mean, log_var = out(norm(body(x)) * (1 + scale) + shift).chunk(2, dim=-1)
            std = (0.5 * log_var.clamp(-5, 2)).exp()
            nxt = (mean + std * noise[t]).detach()
            logp = logp + (-0.5 * ((nxt - mean) / std) ** 2 - std.log()).sum()
            x = nxt
        (-logp / noise.numel()).backward()
        opt.step()

    cpu = time.process_time()
    wall = _median_time(step, repeats)
    return {"step_ms": wall * 1e3, "cpu_ms": (time.process_time() - cpu) * 1e3 / (repeats + 3)}


def mix_steps(processes: int = 2) -> dict:
    """`mix_step` in `processes` processes at once, under the caps margrpo's stages run with."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from margrpo.infra.kernels import apply_caps

    env = dict(os.environ)
    apply_caps(env)
    cmd = [sys.executable, __file__, "--mix-worker"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    parts = [json.loads(p.communicate()[0]) for p in procs]
    return {
        "mix_step_ms_2proc": round(statistics.median(p["step_ms"] for p in parts), 1),
        "mix_cpu_ms_2proc": round(statistics.median(p["cpu_ms"] for p in parts), 1),
        "mix_caps": {k: env.get(k) for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--mix-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mix_worker:
        print(json.dumps(mix_step()))
        return
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
    result.update(mix_steps())
    result["cpu_seconds"] = round(time.process_time() - cpu_start, 1)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
