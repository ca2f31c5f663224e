"""What a GRPO process's CPU spends on its reward models' image preprocessing per step, at 1 and 2 torch threads:
the question behind the paper configs' `threads: 1` (one CPU per GPU process, which also preprocesses).

The real path (`margrpo.rewards.real._common._to_pil`, then a CLIP image processor: the preprocessing of HPS v2's
open_clip transform and of the transformers scorers, resize to 224 bicubic, centre crop, normalise) on one
process's share of a paper step (3 prompts x 4 images, 512 px: NOVA's resolution). Prints the milliseconds a step
spends there and, for comparison, what fraction of a step of `--step-seconds` that is.

    python benchmarks/reward_preprocessing.py [--images 12] [--size 512] [--repeats 20] [--step-seconds 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def preprocess_ms(images: torch.Tensor, processor, repeats: int) -> list[float]:
    from margrpo.rewards.real._common import _to_pil

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        processor(images=_to_pil(images), return_tensors="pt")
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=12, help="images a process scores a step (paper: 3 x 4)")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=20.0, help="a step's length to compare with")
    args = parser.parse_args()
    from transformers import CLIPImageProcessor

    processor = CLIPImageProcessor()  # the defaults are CLIP's preprocessing; no weights are read
    images = torch.rand(args.images, 3, args.size, args.size, generator=torch.Generator().manual_seed(0))
    cpu0 = time.process_time()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        preprocess_ms(images, processor, 2)  # warm-up
        times = preprocess_ms(images, processor, args.repeats)
        median = statistics.median(times)
        print(
            f"threads {threads}: {args.images} images of {args.size} px: median {median:.1f} ms a step "
            f"(min {min(times):.1f}, max {max(times):.1f}); {100 * median / 1000 / args.step_seconds:.2f}% of a "
            f"{args.step_seconds:.0f} s step"
        )
    print(f"CPU time of the script's measurements: {time.process_time() - cpu0:.1f} s")


if __name__ == "__main__":
    main()
