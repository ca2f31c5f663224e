"""How much of a GRPO step's gradient is signal: is the policy gradient of one batch an ascent direction of
the expected reward, or noise? Measured on a trained run's own trainer (its spec.json), at its base policy.

Why: on the toy, RL at any lr tried lowers the validation reward, the training reward with it (docs/findings.md,
"Why RL does not climb"). Two causes predict that: a biased estimator (the policy gradient points down) or a
noise-dominated one (each step moves the policy mostly at random, and a random move away from a trained policy
costs reward). This tells them apart, at one parameter point, through the real code path (`rollout_and_score`,
`plan_updates`, `backward`: `GRPOTrainer.update` without its optimizer step):

- the loss gradients g_b of B independent batches (the trainer's own streams, steps 0..B-1);
- their mean pairwise cosine rho: for g_b = s + n_b (signal s, independent noise), E[cos] ~ |s|^2 / E|g|^2, so
  rho ~ 0 says one batch's gradient is noise, and a mean over ~1/rho batches is needed for an even split;
- the expected reward (fixed prompts and noise: common random numbers) after a step of L2 length eta along
  -mean(g) (descent of the loss = ascent of the reward), along +mean(g), along Adam's first step (the sign
  of -mean(g)) and along a random direction. A working estimator gives descent > 0 > ascent.

    python benchmarks/gradient_signal.py results/toy/train/toy-nova/mixed/fix/seed0/spec.json \\
        [--batches 16] [--eta 0.05 0.15] [--set grpo.group_order=shared] [--set sampling.final_step_noise=true]

Takes ~1.7 CPU-s per batch and ~8 CPU-s per evaluated direction and eta (toy-nova, 48 prompts x 4 images).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
from margrpo.policy import load_policy
from margrpo.rewards import build_reward_mix
from margrpo.rollout import generate
from margrpo.stages._common import prompt_set, reward_options, sampling_config


def parse_set(items: list[str]) -> list[tuple[str, str, object]]:
    out = []
    for item in items:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        if section not in ("grpo", "variant", "sampling") or not name or not _:
            raise SystemExit(f"--set {item!r}: expected grpo.<key>=<value>, variant.<key>=<value> or sampling.<key>=<value>")
        out.append((section, name, json.loads(value) if value[:1] in "0123456789-[{tfn" else value))
    return out


def build(spec_path: Path, changes, root: Path) -> GRPOTrainer:
    spec = json.loads(spec_path.read_text())
    for section, name, value in changes:
        spec[section][name] = value
    cfg = GRPOConfig.from_spec(spec, precision="no")
    cfg.seed = spec.get("seed", 0)
    inputs = {k: root / v for k, v in spec["inputs"].items() if v}
    weights = spec["reward"]["weights"]
    reward = build_reward_mix(weights, reward_options(weights, spec.get("reward_models", {}),
                                                      str(inputs["toyclip_dir"]) if "toyclip_dir" in inputs else None))
    suites = inputs["suites_dir"]
    policy = load_policy(inputs["policy_dir"], torch.device("cpu"))
    return GRPOTrainer(policy, reward, prompt_set(suites / "train.jsonl"), prompt_set(suites / "val.jsonl"),
                       sampling_config(spec["sampling"]), cfg, tempfile.mkdtemp(prefix="gradient-signal-"))


def batch_gradient(tr: GRPOTrainer, step: int) -> tuple[torch.Tensor, float]:
    """The loss gradient of the batch the trainer draws at `step` (flat over the trained parameters)."""
    tr.step = step
    batch = tr.rollout_and_score()
    tr.backward(batch, tr.plan_updates(batch)[0])  # what the optimizer would step on
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in tr.params])
    return flat, batch.rewards.mean().item()


@torch.no_grad()
def expected_reward(tr: GRPOTrainer, prompts: int, group: int, seed: int = 1234) -> torch.Tensor:
    """Per-image rewards of a fixed set of training prompts from fixed noise (the same at every parameter point)."""
    train = tr.train_prompts
    idx = torch.randperm(len(train), generator=torch.Generator().manual_seed(99))[:prompts].tolist()
    g, out = torch.Generator().manual_seed(seed), []
    for a in range(0, prompts, 12):
        part = idx[a : a + 12]
        rollout = generate(tr.policy, [train.prompts[i] for i in part], tr.sampling, group_size=group, generator=g)
        r, _ = tr.reward_fn(rollout.images, rollout.prompts, [train.metadata[i] for i in part for _ in range(group)])
        out.append(r)
    return torch.cat(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("spec", type=Path, help="a run's spec.json (its inputs are read relative to --root)")
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--batches", type=int, default=16)
    p.add_argument("--eta", type=float, nargs="*", default=[0.05, 0.15], help="L2 step lengths to evaluate (none: skip)")
    p.add_argument("--prompts", type=int, default=48, help="training prompts of the expected-reward estimate (x 4 images)")
    p.add_argument("--set", action="append", default=[], help="section.key=value over the spec (grpo, variant, sampling)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tr = build(args.spec, parse_set(args.set), args.root)
    t0 = time.process_time()
    grads, rewards = zip(*(batch_gradient(tr, b) for b in range(args.batches)))
    G = torch.stack(grads)
    B = len(G)
    cos = torch.nn.functional.cosine_similarity(G[:, None], G[None], dim=-1)[~torch.eye(B, dtype=torch.bool)]
    print(f"{B} batches of {tr.cfg.batch_prompts} x {tr.cfg.group_size} images, {time.process_time() - t0:.0f} CPU-s; "
          f"batch reward {sum(rewards) / B:.4f}; settings {args.set or 'as the spec'}")
    print(f"pairwise cos of batch gradients: {cos.mean():+.4f} +- {cos.std() / len(cos) ** 0.5:.4f} (mean +- s.e. over "
          f"{len(cos)} ordered pairs); |g_b| {G.norm(dim=1).mean():.4f}, |mean g| {G.mean(0).norm():.4f}")
    if not args.eta:
        return
    d = G.mean(0)
    start = [p.detach().clone() for p in tr.params]
    r0 = expected_reward(tr, args.prompts, 4)
    print(f"expected reward at the base: {r0.mean():.4f} ({len(r0)} images)")
    directions = {"descent (-mean g)": -d, "ascent (+mean g)": d, "Adam's first step (sign)": -torch.sign(d),
                  "random": torch.randn(d.shape, generator=torch.Generator().manual_seed(7))}
    for name, v in directions.items():
        v = v / v.norm()
        for eta in args.eta:
            offset = 0
            for p, p0 in zip(tr.params, start):
                p.copy_(p0 + eta * v[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
            diff = expected_reward(tr, args.prompts, 4) - r0
            print(f"  {name:26s} eta {eta:.3f}: reward change {diff.mean():+.4f} +- {diff.std() / len(diff) ** 0.5:.4f}")
    for p, p0 in zip(tr.params, start):
        p.copy_(p0)


if __name__ == "__main__":
    main()
