"""`margrpo exact-gradient` and `margrpo gradient-estimator`: the lab's gradient estimators measured at the base.

    margrpo exact-gradient --spec-json '<+Fix train spec>' --policy-dir P --suites-dir S --toypref-dir T \
        --images 1536 --parts 2 --out-dir results/toy/estimators/toy-nova/toypref
    margrpo gradient-estimator --estimator mte --spec-json '<+MTE train spec>' ... --batches 32 \
        --out-dir results/toy/estimators/toy-nova/toypref

The first writes the exact (pathwise) gradient of the expected reward once per base (`exact.pt`, `exact.json`: its
parts' cosine says how well it is pinned down); each part is kept as it is finished, so a killed job resumes. The
second writes `<estimator>/batches.json`: B batch gradients of one estimator (the trainer's own streams, steps
0..B-1 of seed `--seed`: the same rollouts for every estimator), reduced to what `margrpo report estimators` reads
(their Gram matrix, their projections on the exact direction, CPU seconds per batch). Estimators (ESTIMATORS): the
ladder's `fix`, `mte`, `sim`, `committed` (their train specs as they are), `every_step` (+Fix with every AR and
diffusion step credited) and `pathwise` (the exact gradient's estimator on one batch's images: DRaFT-like). With
`--policy-dir` a ladder run's checkpoint and `--exact` the base's exact.pt, the same batches at a trained policy
(rule checkpoint_gradient: claim b along training). Holds B gradients in memory: a toy's instrument (B x 1.8M
floats for toy-nova), not a real-scale one.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import time
from pathlib import Path

from margrpo.stages._common import json_arg, prompt_set, reward_options, setup, write_spec

log = logging.getLogger(__name__)

ESTIMATORS = ("fix", "mte", "sim", "committed", "every_step", "pathwise")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec-json", required=True, help="the train spec the estimator is built on (as Snakemake passes)")
    p.add_argument("--policy-dir", required=True, help="the base policy folder")
    p.add_argument("--suites-dir", required=True, help="folder with train.jsonl and val.jsonl")
    p.add_argument("--toyclip-dir", default=None)
    p.add_argument("--toypref-dir", default=None)
    p.add_argument("--out-dir", required=True, help="the block's folder: exact.pt / exact.json, <estimator>/")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0, help="batch seeds: the trainer's steps 0..B-1 of this seed")
    if p.prog.endswith("exact-gradient"):
        p.add_argument("--images", type=int, required=True, help="images of the exact gradient, over all parts")
        p.add_argument("--parts", type=int, default=2, help="independent parts (even): its halves' cosine")
        p.add_argument("--exact-seed", type=int, default=1000, help="common random numbers of part i: seed + i")
    else:
        p.add_argument("--estimator", required=True, choices=ESTIMATORS)
        p.add_argument("--batches", type=int, required=True, help="B batch seeds")
        p.add_argument(
            "--exact",
            default=None,
            help="the base's exact.pt (default: OUT_DIR/exact.pt); a trained checkpoint's batches project on it too",
        )


def build_trainer(args, spec: dict):
    """The GRPO trainer of `spec` on `--policy-dir`, as `margrpo train` builds it, in a scratch folder that is
    removed with the trainer (nothing saved)."""
    import shutil
    import tempfile
    import weakref

    from margrpo.experiment.settings import train_settings
    from margrpo.grpo.trainer import GRPOTrainer
    from margrpo.policy import load_policy
    from margrpo.rewards import build_reward_mix

    device = setup(args.threads, spec.get("device", "auto"))
    suites = Path(args.suites_dir)
    val = prompt_set(suites / "val.jsonl")
    settings = train_settings(spec, "--spec-json", 1, len(val), suites / "val.jsonl")
    cfg = settings.grpo
    cfg.seed, cfg.grad_clip = args.seed, 0.0
    weights = settings.reward_weights
    reward = build_reward_mix(
        weights, reward_options(weights, settings.reward_models, args.toyclip_dir, args.toypref_dir)
    )
    policy = load_policy(args.policy_dir, device)
    scratch = tempfile.mkdtemp(prefix="margrpo-estimator-")
    trainer = GRPOTrainer(
        policy, reward, prompt_set(suites / "train.jsonl"), val, settings.sampling, cfg, scratch, device=device,
        policy_settings=settings.policy,
    )  # fmt: skip
    weakref.finalize(trainer, shutil.rmtree, scratch, ignore_errors=True)
    return trainer


def every_step_spec(spec: dict) -> dict:
    """+Fix with every AR step and every stochastic diffusion step credited (grpo.mask_steps / diffusion_steps)."""
    from margrpo.grpo.rollout import SamplingConfig, stochastic_steps

    sampling = SamplingConfig(**spec["sampling"])
    spec = copy.deepcopy(spec)
    spec["grpo"].update(mask_steps=sampling.ar_steps, diffusion_steps=stochastic_steps(sampling))
    return spec


def run(args) -> None:
    if args.stage == "exact-gradient":
        exact_gradient(args)
    else:
        estimator(args)


def exact_gradient(args) -> None:
    import torch

    from margrpo.grpo.gradient_estimates import pathwise_gradient
    from margrpo.infra.files import atomic_write_json

    if args.parts < 2 or args.parts % 2 or args.images % (4 * args.parts):
        raise SystemExit(f"--images {args.images} --parts {args.parts}: an even number of parts of a multiple of 4")
    spec = json_arg(args.spec_json, "--spec-json")
    out = Path(args.out_dir)
    partial_dir = out / "exact.parts"
    partial_dir.mkdir(parents=True, exist_ok=True)
    trainer = build_trainer(args, spec)
    parts, rewards, cpu = [], [], 0.0
    for i in range(args.parts):
        saved = partial_dir / f"part{i}-of-{args.parts}-{args.images}-seed{args.exact_seed + i}.pt"
        if saved.exists():  # a killed job resumes from its finished parts
            part = torch.load(saved)
            log.info(f"part {i}: read back from {saved}")
        else:
            t0 = time.process_time()
            grad, reward = pathwise_gradient(trainer, args.images // args.parts, args.exact_seed + i)
            if not torch.isfinite(grad).all():
                raise FloatingPointError(f"exact gradient, part {i}: non-finite; nothing written")
            part = {"gradient": grad, "reward": reward, "cpu_s": time.process_time() - t0}
            torch.save(part, saved)
            log.info(
                f"part {i}: {args.images // args.parts} images, {part['cpu_s']:.0f} CPU-s, |grad| {grad.norm():.4g}"
            )
        parts.append(part["gradient"])
        rewards.append(part["reward"])
        cpu += part["cpu_s"]
    half = args.parts // 2
    a, b = torch.stack(parts[:half]).mean(0).double(), torch.stack(parts[half:]).mean(0).double()
    gradient = ((a + b) / 2).float()
    record = {
        "images": args.images,
        "parts": args.parts,
        "exact_seed": args.exact_seed,
        "parameters": gradient.numel(),
        "norm": gradient.norm().item(),
        "half_cos": torch.nn.functional.cosine_similarity(a, b, dim=0).item(),
        "reward": sum(rewards) / len(rewards),
        "cpu_s": cpu,
    }
    torch.save({"gradient": gradient, **record}, out / "exact.pt")
    write_spec(out / "exact.parts", {"spec": spec, **record})
    atomic_write_json(out / "exact.json", record, indent=1)
    log.info(f"exact gradient: {json.dumps(record)}")


def estimator(args) -> None:
    import torch

    from margrpo.grpo.gradient_estimates import GROUP, batch_gradient, pathwise_gradient
    from margrpo.infra.files import atomic_write_json

    spec = json_arg(args.spec_json, "--spec-json")
    spec = every_step_spec(spec) if args.estimator == "every_step" else spec
    out = Path(args.out_dir)
    exact_path = Path(args.exact or out / "exact.pt")
    exact = torch.load(exact_path)
    unit = exact["gradient"].double() / exact["gradient"].double().norm()
    trainer = build_trainer(args, spec)
    images = trainer.cfg.batch_prompts * trainer.cfg.group_size
    if args.estimator == "pathwise":  # whole groups of GROUP images: a batch's images, rounded up
        images = -(-images // GROUP) * GROUP
    grads, cpu = [], []
    for b in range(args.batches):
        t0 = time.process_time()
        if args.estimator == "pathwise":  # its own common random numbers per batch seed, apart from the exact's
            g, _ = pathwise_gradient(trainer, images, seed=10_000 * (args.seed + 1) + b)
        else:
            g, _ = batch_gradient(trainer, b)
            g = -g  # the loss's descent: the reward's ascent direction
        cpu.append(time.process_time() - t0)
        if g.numel() != unit.numel():
            raise ValueError(f"{exact_path}: {unit.numel()} parameters, the estimator trains {g.numel()}")
        if not torch.isfinite(g).all():
            raise FloatingPointError(f"{args.estimator}: batch seed {b} gave a non-finite gradient; nothing written")
        grads.append(g.double())
        log.info(f"{args.estimator}: batch {b + 1}/{args.batches}, {cpu[-1]:.2f} CPU-s, |g| {g.norm():.4g}")
    G = torch.stack(grads)
    folder = out / args.estimator
    write_spec(folder, {"spec": spec, "estimator": args.estimator, "batches": args.batches, "seed": args.seed})
    record = {
        "estimator": args.estimator,
        "images": images,
        "loss_gradient": args.estimator != "pathwise",
        "parameters": G.shape[1],
        "gram": (G @ G.T).tolist(),
        "proj": (G @ unit).tolist(),
        "cpu_s": cpu,
    }
    atomic_write_json(folder / "batches.json", record)
