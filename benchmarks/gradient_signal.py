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

    python benchmarks/gradient_signal.py results/toy/train/toy-nova/toypref/fix/seed0/spec.json \\
        [--batches 16] [--eta 0.05 0.15] [--set grpo.group_order=shared] [--set sampling.final_step_noise=true]
    python benchmarks/gradient_signal.py --test    # a tiny random policy, the shapes reward: the code path works

Takes ~1.7 CPU-s per batch and ~8 CPU-s per evaluated direction and eta (toy-nova, 48 prompts x 4 images).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from margrpo.grpo.rollout import generate
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
from margrpo.policy import load_policy
from margrpo.policy.settings import PolicySettings
from margrpo.rewards import build_reward_mix
from margrpo.stages._common import prompt_set, reward_options, sampling_config


def parse_set(items: list[str]) -> list[tuple[str, str, object]]:
    out = []
    for item in items:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        if section not in ("grpo", "variant", "sampling") or not name or not _:
            raise SystemExit(
                f"--set {item!r}: expected grpo.<key>=<value>, variant.<key>=<value> or sampling.<key>=<value>"
            )
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
    model_dir = {
        name: str(inputs[f"{name}_dir"]) if f"{name}_dir" in inputs else None for name in ("toyclip", "toypref")
    }
    reward = build_reward_mix(
        weights, reward_options(weights, spec.get("reward_models", {}), model_dir["toyclip"], model_dir["toypref"])
    )
    suites = inputs["suites_dir"]
    policy = load_policy(inputs["policy_dir"], torch.device("cpu"))
    return GRPOTrainer(
        policy,
        reward,
        prompt_set(suites / "train.jsonl"),
        prompt_set(suites / "val.jsonl"),
        sampling_config(spec["sampling"]),
        cfg,
        tempfile.mkdtemp(prefix="gradient-signal-"),
        policy_settings=PolicySettings.from_spec(spec),
    )


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


def tiny_spec(root: Path) -> Path:
    """--test: a tiny random toy-nova, the smoke world's suites and the +Fix spec of config/smoke.yaml on a random
    toypref (nothing trained: its scores still differ within a group), written under `root`; returns its spec.json."""
    from margrpo.experiment.config import load_config, train_spec
    from margrpo.infra.files import atomic_write_json
    from margrpo.policy.toy import ToyMAR, ToyMARConfig
    from margrpo.prompts.shapesworld import build_suites
    from margrpo.prompts.suites import write_suite
    from margrpo.rewards.toyclip import ToyClipConfig
    from margrpo.rewards.toypref import ToyPref, ToyPrefConfig
    from margrpo.world import PRESETS, prompt_vocabulary

    world = PRESETS["grid4-lit"]
    suites = build_suites(world, seed=0, n_train=24, n_val=6, n_eval=6)
    for split, records in suites.items():
        write_suite(records, root / "suites" / f"{split}.jsonl")
    torch.manual_seed(0)
    cfg = ToyMARConfig(
        head_type="flow",
        vocab=prompt_vocabulary(world),
        width=32,
        depth=1,
        heads=4,
        head_width=32,
        head_depth=1,
        text_width=16,
        text_depth=1,
        text_heads=2,
        image_size=world.image_size,
    )
    policy = ToyMAR(cfg)
    with torch.no_grad():  # the head starts at zero (adaLN-zero): give it an output that varies with z
        for q in policy.diffloss.parameters():
            q.add_(0.05 * torch.randn_like(q))
    policy.save_pretrained(root / "policy")
    vocab = sorted(set(prompt_vocabulary(world)))
    ToyPref(
        ToyPrefConfig(
            clip=ToyClipConfig(
                image_size=world.image_size, width=16, embed_dim=16, text_width=16, text_depth=1, vocab=vocab
            ),
            aesthetic_width=8,
        )
    ).save_pretrained(root / "toypref")
    config = load_config(Path(__file__).resolve().parents[1] / "config" / "smoke.yaml")
    spec = train_spec(config, "toy-nova", "mixed", "fix")
    spec["reward"]["weights"] = {"toypref": 1.0}
    spec["grpo"].update(batch_prompts=2, group_size=2)
    spec["inputs"] = {"policy_dir": "policy", "suites_dir": "suites", "toypref_dir": "toypref"}
    atomic_write_json(root / "spec.json", spec)
    return root / "spec.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("spec", type=Path, nargs="?", help="a run's spec.json (its inputs are read relative to --root)")
    p.add_argument(
        "--test",
        action="store_true",
        help="a tiny random policy and reward, 3 batches, 4 prompts: the code path works",
    )
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--batches", type=int, default=16)
    p.add_argument(
        "--eta", type=float, nargs="*", default=[0.05, 0.15], help="L2 step lengths to evaluate (none: skip)"
    )
    p.add_argument(
        "--prompts", type=int, default=48, help="training prompts of the expected-reward estimate (x 4 images)"
    )
    p.add_argument(
        "--set", action="append", default=[], help="section.key=value over the spec (grpo, variant, sampling)"
    )
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.test:
        args.root = Path(tempfile.mkdtemp(prefix="gradient-signal-test-"))
        args.spec, args.batches, args.eta, args.prompts = tiny_spec(args.root), 3, [0.05], 4
    elif args.spec is None:
        p.error("give a run's spec.json, or --test")
    tr = build(args.spec, parse_set(args.set), args.root)
    t0 = time.process_time()
    grads, rewards = zip(*(batch_gradient(tr, b) for b in range(args.batches)))
    G = torch.stack(grads)
    B = len(G)
    cos = torch.nn.functional.cosine_similarity(G[:, None], G[None], dim=-1)[~torch.eye(B, dtype=torch.bool)]
    print(
        f"{B} batches of {tr.cfg.batch_prompts} x {tr.cfg.group_size} images, {time.process_time() - t0:.0f} CPU-s; "
        f"batch reward {sum(rewards) / B:.4f}; settings {args.set or 'as the spec'}"
    )
    print(
        f"pairwise cos of batch gradients: {cos.mean():+.4f} +- {cos.std() / len(cos) ** 0.5:.4f} (mean +- s.e. over "
        f"{len(cos)} ordered pairs); |g_b| {G.norm(dim=1).mean():.4f}, |mean g| {G.mean(0).norm():.4f}"
    )
    if not args.eta:
        return
    d = G.mean(0)
    if not d.norm() > 0:
        raise SystemExit("the mean batch gradient is zero (every group's rewards tie?): no direction to step along")
    start = [p.detach().clone() for p in tr.params]
    r0 = expected_reward(tr, args.prompts, 4)
    print(f"expected reward at the base: {r0.mean():.4f} ({len(r0)} images)")
    directions = {
        "descent (-mean g)": -d,
        "ascent (+mean g)": d,
        "Adam's first step (sign)": -torch.sign(d),
        "random": torch.randn(d.shape, generator=torch.Generator().manual_seed(7)),
    }
    for name, v in directions.items():
        v = v / v.norm()
        for eta in args.eta:
            offset = 0
            with torch.no_grad():  # the trained parameters are leaves that require grad
                for p, p0 in zip(tr.params, start):
                    p.copy_(p0 + eta * v[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
            diff = expected_reward(tr, args.prompts, 4) - r0
            print(
                f"  {name:26s} eta {eta:.3f}: reward change {diff.mean():+.4f} +- {diff.std() / len(diff) ** 0.5:.4f}"
            )
    with torch.no_grad():
        for p, p0 in zip(tr.params, start):
            p.copy_(p0)


if __name__ == "__main__":
    main()
