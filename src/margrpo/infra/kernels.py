"""CPU kernel caps: every stage runs the instruction-set level's kernels that an AVX2 machine runs.

Float results of CPU kernels depend on the code path each library picks at run time from the CPU: torch's own
vectorised kernels (AVX-512 or AVX2), MKL's matrix products and oneDNN's convolutions, and training amplifies a
last-bit difference into other numbers and, at the margins, other verdicts. Every `margrpo` stage therefore
starts with the paths capped at AVX2, which every x86 CPU of the last decade has:

    ATEN_CPU_CAPABILITY=avx2        torch's kernels (read when torch first dispatches)
    MKL_CBWR=AVX2,STRICT            MKL's conditional-numerical-reproducibility branch (Intel CPUs; MKL's docs:
                                    other CPUs take its AUTO branch, with fixed cache sizes and reductions), in
                                    its strict mode: without it, on an AVX-512 Xeon, a row of a narrow product
                                    (32 outputs) got other bits at some places of a 256-row block (rows 163-175
                                    and 243-255), so no row blocking made the products batch-invariant
    ONEDNN_MAX_CPU_ISA=AVX2         oneDNN's JIT kernels (convolutions)
    NPY_DISABLE_CPU_FEATURES=...    numpy's AVX-512 dispatch targets

What they change and cost where measured: docs/findings.md ("Do two CPUs give the same numbers?"). A value
already in the environment is kept (the caller chose it); MARGRPO_KERNELS=native sets none. Set before torch
and numpy load: `cli.main` calls `apply_caps` first.
"""

from __future__ import annotations

import os
import platform

CAPS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
}
SWITCH = "MARGRPO_KERNELS"  # "capped" (default) or "native"
X86 = ("x86_64", "amd64", "i686", "i386")


def apply_caps(environ: dict | None = None, machine: str | None = None) -> dict[str, str]:
    """Set each cap that the environment does not already set, on x86 only (the values name x86 paths); returns
    what was set. A no-op under MARGRPO_KERNELS=native. Must run before torch or numpy is imported."""
    environ = os.environ if environ is None else environ
    mode = environ.get(SWITCH, "capped")
    if mode not in ("capped", "native"):
        raise ValueError(f"environment variable {SWITCH}={mode!r}: expected 'capped' or 'native'")
    if mode == "native" or (machine or platform.machine()).lower() not in X86:
        return {}
    added = {k: v for k, v in CAPS.items() if k not in environ}
    environ.update(added)
    return added


def kernel_record() -> dict:
    """What a result's metadata says about the kernels that made it: the caps in force, the code path torch took,
    the CPU, and the thread count (MKL's reproducibility also needs a fixed one)."""
    import torch

    return {
        "mode": os.environ.get(SWITCH, "capped"),
        **{k: os.environ.get(k) for k in CAPS},
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "machine": platform.machine(),
    }


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform reports."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
