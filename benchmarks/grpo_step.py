"""GRPO step costs on the default toy config, measured in one run on this machine.

1. step time of `mte` (S = 4, k = 30%) divided by that of `fix` (target <= 1.10: the paper calls
   the MTE overhead negligible);
2. speed-up of recomputing the chosen (AR step, diffusion step) pairs in batched passes over a
   loop with one pass per pair (target >= 2x);
3. peak memory of a step.

Where the MTE overhead comes from is printed too (rollout with S = 4 vs S = 1). The extra
trajectories cost head evaluations only: (S - 1) * L rows per image (each token once, at the step
that commits it) on top of the committed trajectory's sum over AR steps of the still-unknown
tokens. With K = 8 steps over 16 tokens that sum is small (the head then does most of the
rollout's work and S = 4 adds ~60% head rows); with the paper's K = 64 steps over 1024 tokens it
is large and S = 4 adds a few percent. `--sampling '{"ar_steps": 64}' --model '{"patch_size": 8}'`
measures a toy with that schedule (64 tokens, K = 64; add `--grpo '{"batch_prompts": 2}'` to keep it
short); `--model` alone changes the toy's shape.

    python benchmarks/grpo_step.py [--policy results/pretrain/toy-nova-<hash>/policy] [--steps 4]
"""

import json

import argparse
import statistics
import tempfile
import time

import torch

from margrpo.config import load_config
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer, PromptSet, peak_memory_mb
from margrpo.policy import ToyMAR, ToyMARConfig, load_policy
from margrpo.pretraining import autocast
from margrpo.rollout import SamplingConfig, ar_schedule, generate, replay, stochastic_steps
from margrpo.world import prompt_vocabulary

PROMPTS = ["a red circle", "a blue square and a green triangle", "three yellow circles", "a cyan square above a magenta circle"]


def reward(images, prompts, metadata):
    r = images.mean((1, 2, 3))  # a cheap stand-in: this measures the trainer, not a scorer
    return r, {"brightness": r}


MODEL: dict = {}


def make_policy(path):
    if path and MODEL:
        raise SystemExit("give --policy or --model, not both")
    torch.manual_seed(0)
    return load_policy(path) if path else ToyMAR(ToyMARConfig(vocab=prompt_vocabulary(), **MODEL))


def step_times(policy_path, sampling, grpo, variant, steps) -> list[float]:
    fields = set(GRPOConfig.__dataclass_fields__)
    cfg = GRPOConfig(**{k: v for k, v in {**grpo, **variant, "steps": steps + 1}.items() if k in fields})
    ps = PromptSet(PROMPTS, [{}] * len(PROMPTS))
    trainer = GRPOTrainer(make_policy(policy_path), reward, ps, ps, sampling, cfg, tempfile.mkdtemp())
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        trainer.train_step()
        times.append(time.perf_counter() - t0)
    return times[1:]  # the first step warms up allocators


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="config/config.yaml")
    p.add_argument("--policy", default=None, help="a trained policy folder (default: random init)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="{}", help="ToyMARConfig overrides (random init) as JSON")
    p.add_argument("--grpo", default="{}", help="grpo config overrides as JSON, e.g. '{\"batch_prompts\": 2}'")
    p.add_argument("--sampling", default="{}", help="SamplingConfig overrides as JSON, e.g. '{\"ar_steps\": 64}'")
    args = p.parse_args()
    MODEL.update(json.loads(args.model))
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    policy_name = config["experiments"]["ladder"]["policies"][0]
    sampling = SamplingConfig(**{**config["policies"][policy_name]["sampling"], **json.loads(args.sampling)})
    grpo = dict(config["grpo"], precision=config["mixed_precision"], **json.loads(args.grpo))
    print(f"config {args.config}: policy {policy_name}, K={sampling.ar_steps}, T={sampling.diffusion_steps}, "
          f"|M|={grpo['mask_steps']}, |T|={grpo['diffusion_steps']}, {grpo['batch_prompts']}x{grpo['group_size']} images, {args.threads} thread(s)")

    fix = step_times(args.policy, sampling, grpo, {"freeze_head": True}, args.steps)
    mte = step_times(args.policy, sampling, grpo, {"freeze_head": True, "trajectories": 4, "top_frac": 0.3}, args.steps)
    f, m = statistics.median(fix), statistics.median(mte)
    print(f"step time fix: {f:.3f} s, mte (S=4, k=0.3): {m:.3f} s (medians of {args.steps}) -> ratio {m / f:.3f} (target <= 1.10)")

    policy = make_policy(args.policy)
    head_share = sum(p.numel() for p in policy.head_parameters()) / sum(p.numel() for p in policy.parameters())

    def rollout(S):
        with autocast(torch.device("cpu"), grpo["precision"]):
            generate(policy, PROMPTS[: grpo["batch_prompts"]], sampling, group_size=grpo["group_size"], generator=torch.Generator().manual_seed(0),
                     trajectories=S, mte_generator=torch.Generator().manual_seed(1))

    t1 = min(_timed(lambda: rollout(1)) for _ in range(3))
    t4 = min(_timed(lambda: rollout(4)) for _ in range(3))
    L = policy.seq_len
    main_rows = sum([L] + ar_schedule(policy, sampling)[:-1])  # unknown tokens before each AR step
    print(f"rollout alone: S=1 {t1:.3f} s, S=4 {t4:.3f} s -> {t4 / t1:.2f}x (head = {100 * head_share:.0f}% of the parameters; "
          f"head rows per image: {main_rows} committed trajectory + {3 * L} extra = +{300 * L / main_rows:.0f}%)")
    with autocast(torch.device("cpu"), grpo["precision"]):
        r = generate(policy, PROMPTS[: grpo["batch_prompts"]], sampling, group_size=grpo["group_size"], generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    ar = torch.randperm(r.committed.shape[0], generator=g)[: grpo["mask_steps"]].sort().values
    diff = torch.stack([torch.randperm(stochastic_steps(sampling), generator=g)[: grpo["diffusion_steps"]].sort().values for _ in ar])

    def batched():
        with autocast(torch.device("cpu"), grpo["precision"]):
            replay(policy, r, ar, diff).log_prob.sum().backward()

    def looped():
        for m_ in range(len(ar)):
            for u in range(diff.shape[1]):
                with autocast(torch.device("cpu"), grpo["precision"]):
                    replay(policy, r, ar[m_ : m_ + 1], diff[m_ : m_ + 1, u : u + 1]).log_prob.sum().backward()

    def best(fn, n=3):
        fn()
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return min(out)

    tb, tl = best(batched), best(looped)
    print(f"log-prob recomputation + backward of {len(ar)}x{diff.shape[1]} chosen steps: batched {tb:.3f} s, "
          f"one pass per step {tl:.3f} s -> speed-up {tl / tb:.2f}x (target >= 2x)")
    print(f"peak memory (max RSS of this process): {peak_memory_mb():.0f} MB")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
