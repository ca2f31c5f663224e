"""GRPO step costs on the default toy config, measured in one run on this machine.

1. step time of `mte` (S = 4, k = 30%) divided by that of `fix` (target <= 1.15 at the paper's
   schedule: the paper calls the MTE overhead negligible), in CPU time of this one-thread process,
   the two trainers taking their steps in turn, so other work on a shared machine does not enter;
2. speed-up of recomputing the chosen (AR step, diffusion step) pairs in batched passes over a
   loop with one pass per pair (target >= 2x);
3. peak memory of a step.

Where the MTE overhead comes from is printed too (rollout with S = 4 vs S = 1). MTE (Algorithm 2)
draws S - 1 extra trajectories of every token predicted at each of the |M| chosen AR steps, batched
into the committed trajectory's head calls: (S - 1) * sum over the chosen steps of the unknown tokens
extra head rows per image, on top of the committed trajectory's: every unknown token at the chosen steps,
the committed ones at the others (the rollout records in full only what training reads). Per image that is
L + |M| / K * sum_k (unknown_k - committed_k) rows for the committed trajectory and (S - 1) |M| / K * sum_k
unknown_k extra (the default toy: 23 + 27; the paper's schedule, 1024 tokens, K = 64, |M| = 12: about 8,700 +
23,800), plus the replay of the extra trajectories inside the uncertainty mask (a fraction k of the loss
tokens, S - 1 times). `--sampling '{"ar_steps": 64}'
--model '{"patch_size": 8}' --grpo '{"mask_steps": 12, "diffusion_steps": 10, "batch_prompts": 2}'`
measures a toy with the paper's schedule (64 tokens, K = 64, |M| = 12, |T| = 10).

    python benchmarks/grpo_step.py [--policy results/pretrain/toy-nova-<hash>/policy] [--steps 4]
"""

import argparse
import json
import statistics
import tempfile
import time

import torch
from torch import nn

from margrpo.experiment.config import load_config
from margrpo.grpo.replay import replay
from margrpo.grpo.rollout import SamplingConfig, ar_schedule, generate, stochastic_steps
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer, choose_steps
from margrpo.infra.runtime import autocast, peak_memory_mb
from margrpo.policy import ToyMAR, ToyMARConfig, load_policy
from margrpo.policy.layers import SimpleMLPAdaLN
from margrpo.policy.settings import PolicySettings
from margrpo.prompts.suites import PromptSet
from margrpo.world import prompt_vocabulary

PROMPTS = [
    "a red circle",
    "a blue square and a green triangle",
    "three yellow circles",
    "a cyan square above a magenta circle",
    "two green triangles",
    "a hollow blue circle to the left of a striped red square",
]  # >= the default ladder's 6 prompts per step


def reward(images, prompts, metadata):
    r = images.mean((1, 2, 3))  # a cheap stand-in: this measures the trainer, not a scorer
    return r, {"brightness": r}


MODEL: dict = {}


def make_policy(path, cls: type | None = None, **kwargs):
    """A trained toy (`path`), or a new one (random init with MODEL's overrides) of class `cls` built with `kwargs`:
    ToyMAR by default, LatentToyMAR (`channels=C`), or a subclass."""
    if path and MODEL:
        raise SystemExit("give --policy or --model, not both")
    if path and (cls or kwargs):
        raise SystemExit("a trained --policy is loaded as it was saved")
    torch.manual_seed(0)
    if path:
        return load_policy(path)
    return (cls or ToyMAR)(ToyMARConfig(vocab=prompt_vocabulary(), **MODEL), **kwargs)


class LatentToyMAR(ToyMAR):
    """The toy generating `channels`-channel tokens that a frozen linear codec decodes to its pixel patches (the
    shape of toy revision 4's tokens, issue 43): a new token projection and head of that width, the rest the toy's.
    The codec is random here: a step's cost depends on shapes, not values."""

    def __init__(self, config: ToyMARConfig, channels: int):
        super().__init__(config)
        c, pixels = config, self.token_dim
        out_factor = 2 if (c.head_type == "ddpm" and c.ddpm_variance == "learned_range") else 1
        self.token_dim = channels
        self.token_proj = nn.Linear(channels, c.width)
        self.diffloss = SimpleMLPAdaLN(
            channels, c.width, c.head_width, c.head_depth, channels * out_factor, c.head_z_input
        )
        basis, _ = torch.linalg.qr(torch.randn(pixels, channels))  # orthonormal columns: [pixels, C]
        self.register_buffer("codec_basis", basis.T.contiguous())  # [C, pixels]
        self.register_buffer("codec_mean", torch.zeros(pixels))

    def encode(self, images):
        return (super().encode(images) - self.codec_mean) @ self.codec_basis.T

    def decode(self, tokens):
        return super().decode(tokens.float() @ self.codec_basis + self.codec_mean)


def make_trainer(
    policy, sampling, grpo, variant, steps, prompts=PROMPTS, reward_fn=reward, trainer_class=GRPOTrainer
) -> GRPOTrainer:
    """`policy`: a ToyMAR, or make_policy's argument (a trained policy's folder; None: random init). `grpo` and
    `variant` may set GRPOConfig's fields and the policy's settings (PolicySettings) alike. `trainer_class`:
    GRPOTrainer or a subclass."""
    settings = {**grpo, **variant, "steps": steps + 1}
    cfg = GRPOConfig(**{k: v for k, v in settings.items() if k in GRPOConfig.__dataclass_fields__})
    policy_settings = PolicySettings(**{k: v for k, v in settings.items() if k in PolicySettings.__dataclass_fields__})
    ps = PromptSet(prompts, [{}] * len(prompts))
    policy = policy if isinstance(policy, ToyMAR) else make_policy(policy)
    return trainer_class(policy, reward_fn, ps, ps, sampling, cfg, tempfile.mkdtemp(), policy_settings=policy_settings)


def interleaved_step_times(trainers, steps, clock=time.process_time) -> list[list[float]]:
    """Step times of several trainers taking their steps in turn (the first round warms up allocators).

    The default clock is this process's CPU time: with one thread it is the step's work, whatever else
    runs on the machine (wall time on a shared 2-core machine varied 3x between identical steps)."""
    times = [[] for _ in trainers]
    for _ in range(steps + 1):
        for t, trainer in zip(times, trainers):
            t0 = clock()
            trainer.train_step()
            t.append(clock() - t0)
    return [t[1:] for t in times]


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
    print(
        f"config {args.config}: policy {policy_name}, K={sampling.ar_steps}, T={sampling.diffusion_steps}, "
        f"|M|={grpo['mask_steps']}, |T|={grpo['diffusion_steps']}, {grpo['batch_prompts']}x{grpo['group_size']} "
        f"images, {args.threads} thread(s)"
    )

    fix, mte = interleaved_step_times(
        [
            make_trainer(args.policy, sampling, grpo, {"freeze_head": True}, args.steps),
            make_trainer(
                args.policy, sampling, grpo, {"freeze_head": True, "trajectories": 4, "top_frac": 0.3}, args.steps
            ),
        ],
        args.steps,
    )
    f, m = statistics.median(fix), statistics.median(mte)
    ratios = [b / a for a, b in zip(fix, mte)]
    print(
        f"step CPU time fix: {f:.3f} s, mte (S=4, k=0.3): {m:.3f} s (medians of {args.steps}, steps taken in turn) "
        f"-> ratio {m / f:.3f} "
        f"(per-step ratios {min(ratios):.2f}-{max(ratios):.2f}; target <= 1.15 at the paper's schedule)"
    )

    policy = make_policy(args.policy)
    head_share = sum(p.numel() for p in policy.head_parameters()) / sum(p.numel() for p in policy.parameters())

    chosen = choose_steps(
        len(ar_schedule(policy, sampling)),
        stochastic_steps(sampling),
        grpo["mask_steps"],
        grpo["diffusion_steps"],
        torch.Generator().manual_seed(1),
    )[0]

    def rollout(S):
        with autocast(torch.device("cpu"), grpo["precision"]):
            generate(
                policy,
                PROMPTS[: grpo["batch_prompts"]],
                sampling,
                group_size=grpo["group_size"],
                generator=torch.Generator().manual_seed(0),
                trajectories=S,
                mte_steps=chosen,
                mte_generator=torch.Generator().manual_seed(1),
                full_steps=chosen,
            )

    t1 = min(_timed(lambda: rollout(1)) for _ in range(3))
    t4 = min(_timed(lambda: rollout(4)) for _ in range(3))
    L = policy.seq_len
    unknown = [L] + ar_schedule(policy, sampling)[:-1]  # unknown tokens before each AR step
    K, share = len(unknown), grpo["mask_steps"] / len(unknown)  # expected over the uniformly chosen |M| steps
    main_rows = L + share * (sum(unknown) - L)  # committed tokens everywhere, every unknown one at the chosen steps
    extra_rows = 3 * share * sum(unknown)
    print(
        f"rollout CPU time alone (MTE at |M| = {grpo['mask_steps']} of {K} steps): S=1 {t1:.3f} s, S=4 {t4:.3f} s "
        f"-> {t4 / t1:.2f}x (head = {100 * head_share:.0f}% of the parameters; head rows per image: "
        f"{main_rows:.0f} committed trajectory "
        f"+ {extra_rows:.0f} extra on average = +{100 * extra_rows / main_rows:.0f}%)"
    )
    with autocast(torch.device("cpu"), grpo["precision"]):
        r = generate(
            policy,
            PROMPTS[: grpo["batch_prompts"]],
            sampling,
            group_size=grpo["group_size"],
            generator=torch.Generator().manual_seed(0),
        )
    ar, diff = choose_steps(
        r.committed.shape[0],
        stochastic_steps(sampling),
        grpo["mask_steps"],
        grpo["diffusion_steps"],
        torch.Generator().manual_seed(1),
    )

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
        return min(_timed(fn) for _ in range(n))

    tb, tl = best(batched), best(looped)
    print(
        f"log-prob recomputation + backward (CPU time) of {len(ar)}x{diff.shape[1]} chosen steps: batched {tb:.3f} s, "
        f"one pass per step {tl:.3f} s -> speed-up {tl / tb:.2f}x (target >= 2x)"
    )
    print(f"peak memory (max RSS of this process): {peak_memory_mb():.0f} MB")


def _timed(fn) -> float:
    """CPU seconds of fn (one thread: its work, whatever else the machine runs)."""
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


if __name__ == "__main__":
    main()
