"""Cost of the toy policy on this machine: one GRPO-sized rollout and its arithmetic efficiency.

Prints the wall time of one rollout of 3 prompts x 4 images with the given K and T (CFG on), the
FLOPs it performs (counted by torch's FlopCounterMode on the real code path), the achieved GFLOP/s,
and that as a fraction of a large float32 matmul's GFLOP/s measured in the same run.

    python benchmarks/policy_cost.py [--policy results/pretrain/toy-nova-<hash>/policy] [--threads 1]
"""

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from margrpo.policy import ToyMAR, ToyMARConfig, load_policy
from margrpo.rollout import SamplingConfig, generate
from margrpo.runtime import autocast
from margrpo.world import prompt_vocabulary

PROMPTS = ["a red circle", "a blue square and a green triangle", "three yellow circles"]


def matmul_gflops(n: int = 2048, repeats: int = 5, dtype=torch.float32) -> float:
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t0 = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * n**3 * repeats / (time.perf_counter() - t0) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default=None, help="a trained policy folder (default: random weights, default config)")
    p.add_argument("--head", default="flow", choices=["flow", "ddpm"])
    p.add_argument("--ar-steps", type=int, default=8)
    p.add_argument("--diffusion-steps", type=int, default=20)
    p.add_argument("--precision", default="bf16", choices=["no", "bf16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    policy = load_policy(args.policy) if args.policy else ToyMAR(ToyMARConfig(head_type=args.head, vocab=prompt_vocabulary()))
    sampling = SamplingConfig(ar_steps=args.ar_steps, diffusion_steps=args.diffusion_steps, cfg_scale=3.0)

    def rollout():
        with autocast(torch.device("cpu"), args.precision):
            return generate(policy, PROMPTS, sampling, group_size=4, generator=torch.Generator().manual_seed(0))

    rollout()  # warm-up
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        rollout()
        times.append(time.perf_counter() - t0)
    with FlopCounterMode(display=False) as counter:
        rollout()
    flops = counter.get_total_flops()
    seconds = min(times)
    achieved = flops / seconds / 1e9
    peak32 = matmul_gflops()
    peak = matmul_gflops(dtype=torch.bfloat16) if args.precision == "bf16" else peak32
    print(f"policy: {args.policy or 'random init, default ToyMARConfig'} ({sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M params), "
          f"{policy.seq_len} tokens x {policy.token_dim}, K={args.ar_steps}, T={args.diffusion_steps}, CFG 3, {args.precision}, {args.threads} thread(s)")
    print(f"rollout 3 prompts x 4 images: {seconds:.3f} s (best of {args.repeats}; all: {', '.join(f'{t:.3f}' for t in times)})")
    print(f"FLOPs per rollout: {flops / 1e9:.2f} GFLOP -> {achieved:.1f} GFLOP/s achieved")
    print(f"large matmul (2048^3): float32 {peak32:.1f} GFLOP/s, {args.precision if args.precision == 'bf16' else 'float32'} {peak:.1f} GFLOP/s "
          f"-> rollout efficiency {achieved / peak:.1%} of the same-precision matmul")


if __name__ == "__main__":
    main()
