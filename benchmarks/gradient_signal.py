"""How much of a GRPO step's gradient is signal: is the policy gradient of one batch an ascent direction of
the expected reward, or noise? Measured on a trained run's own trainer (its spec.json), at its base policy.

Why: on the toy, RL at any lr tried lowers the validation reward, the training reward with it (docs/findings.md,
"Why RL does not climb"). Two causes predict that: a biased estimator (the policy gradient points down) or a
noise-dominated one (each step moves the policy mostly at random, and a random move away from a trained policy
costs reward). This tells them apart, at one parameter point, through the real code path (`rollout_and_score`,
`plan_updates`, `accumulate`: an update's gradient without its optimizer step):

- the loss gradients g_b of B independent batches (the trainer's own streams, steps 0..B-1);
- their mean pairwise cosine rho: for g_b = s + n_b (signal s, independent noise), E[cos] ~ |s|^2 / E|g|^2, so
  rho ~ 0 says one batch's gradient is noise, and a mean over ~1/rho batches is needed for an even split;
- the expected reward (fixed prompts and noise: common random numbers) after a step of L2 length eta along
  -mean(g) (descent of the loss = ascent of the reward), along +mean(g), along Adam's first step (the sign
  of -mean(g)) and along a random direction. A working estimator gives descent > 0 > ascent; the two split into
  the direction part (descent - ascent) / 2 and the curvature part (descent + ascent) / 2 (`direction_and_curvature`):
  a step that costs reward both ways is curvature, not a wrong sign;
- with `--exact N`, the exact gradient of the expected reward (`exact_gradient`: pathwise, backpropagated through
  the reparameterised sampler, N images from common random numbers: fixed prompts, orders and noise, in two
  independent halves whose cosine says how stable it is), and the cosine between it and the ascent direction
  -mean(g) of 1, 4, 16, ... batches (`--groups`), over the batch seeds of `--seeds`. An unbiased estimator's cosine
  rises towards 1 as batches are added (at the rate its noise allows); a biased one's stays near zero or below.
  Needs a differentiable reward (toypref, toyclip). Over all batches of all seeds: the projection of each batch's
  ascent direction on the exact one (mean +- s.e.);
- with `--weighted F`, what GRPO's batch direction is in expectation (`grpo_expectation`, centred advantages: the
  pathwise gradient with each AR step weighted as the loss's token means weigh it), its cosine with the exact
  gradient, and from the batches' noise the number of batches whose mean reaches a cosine of 0.5;
- `--advantages group centered`: the batch gradients of the trainer's advantages and of R - group mean, from the
  same rollouts; `--save-grads` / `--from-grads` keep them for another exact-gradient estimate (`--also-exact`).

    python benchmarks/gradient_signal.py results/toy/train/toy-nova/toypref/fix/seed0/spec.json \\
        [--batches 16] [--eta 0.05 0.15] [--set grpo.group_order=shared] [--set sampling.final_step_noise=true]
    python benchmarks/gradient_signal.py <spec.json> --batches 64 --eta --exact 768 --seeds 0 1 2 3 4 \\
        [--exact-file exact.pt] [--weighted weighted.pt] [--save-grads grads/] [--json out.json]
    python benchmarks/gradient_signal.py --test    # a tiny random policy and toypref: the code path works, and the
                                                   # exact gradient agrees with a finite difference

Takes ~1.7 CPU-s per batch and ~8 CPU-s per evaluated direction and eta (toy-nova, 48 prompts x 4 images); on the
default +Fix spec (revision 3, 2026-11-28) ~2.2 CPU-s per batch of 24 images (~11 with every step credited) and
~0.2 CPU-s per image of the exact gradient.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from margrpo.grpo.gradient_estimates import flat_grad, pathwise_gradient, pathwise_reward
from margrpo.grpo.rollout import each_ar_pass_within, generate, stochastic_steps
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
    cfg.grad_clip = 0.0  # an update would measure the norm and scale by exactly 1: the batch gradient as it is
    trainer = GRPOTrainer(
        policy,
        reward,
        prompt_set(suites / "train.jsonl"),
        prompt_set(suites / "val.jsonl"),
        sampling_config(spec["sampling"]),
        cfg,
        tempfile.mkdtemp(prefix="gradient-signal-"),
        policy_settings=PolicySettings.from_spec(spec),
    )
    return trainer


ADVANTAGE_FORMS = ("group", "centered")


def batch_gradient(tr: GRPOTrainer, step: int, forms: tuple[str, ...] = ("group",)) -> tuple[torch.Tensor, float]:
    """The loss gradient of the batch the trainer draws at `step` (flat over the trained parameters); with several
    advantage `forms`, one gradient per form from the same rollout ([F, P]): "group" the trainer's own (design.md §3.4,
    (R - group mean) / group std), "centered" R - group mean (no std: the likelihood-ratio estimator of the
    gradient of E[R] itself, up to the factor (G - 1) / G)."""
    batch = tr.rollout_and_score(step)
    plan = tr.plan_updates(batch)[0]
    flats, own = [], batch.adv
    for form in forms:
        batch.adv = own
        if form == "centered":
            r = batch.rewards.double().view(-1, tr.cfg.group_size)
            batch.adv = (r - r.mean(1, keepdim=True)).reshape(-1).to(own.dtype)
        elif form != "group":
            raise ValueError(f"advantage form {form!r}: expected one of {ADVANTAGE_FORMS}")
        tr.accumulate(batch, plan)  # the batch gradient an update steps on
        flats.append(flat_grad(tr.params))
    return (flats[0] if len(forms) == 1 else torch.stack(flats)), batch.rewards.mean().item()


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


def grpo_step_weights(tr: GRPOTrainer) -> list[float]:
    """Per AR step k, the weight GRPO's expected gradient gives the pathwise contribution of step k's diffusion steps
    (the parameters' direct effect on their means), up to one constant: 1 / (tokens still unknown before step k).

    The loss at a chosen AR step is a mean over the completion mask's tokens (n_k per image) and the chosen diffusion
    steps, then over the chosen AR steps; every AR step and diffusion step is equally likely to be chosen. The
    likelihood-ratio term of a (k, t) pair has the expectation of its pathwise term (Stein's lemma: the step is a
    Gaussian around a mean the parameters move), the uncommitted tokens' terms have expectation zero (their samples
    are discarded), so with centred advantages R - group mean:
        E[-g] = (G - 1) / G / (K T) * sum_k (1 / n_k) * P_k,   P_k the pathwise gradient through step k's means,
    for the default credit and for every step credited alike. `exact_gradient(weights=...)` computes the sum."""
    from margrpo.grpo.rollout import ar_schedule

    schedule = ar_schedule(tr.policy, tr.sampling)
    unknown_before = [tr.policy.seq_len, *schedule[:-1]]
    return [1.0 / n for n in unknown_before]


@contextlib.contextmanager
def _weighted_steps(tr: GRPOTrainer, weights: list[float] | None):
    """While generating: the k-th AR pass sees the trained parameters as p.detach() + w_k (p - p.detach()) (the
    same values; w_k times the gradient)."""
    if weights is None:
        yield
        return
    calls = [0]
    names = [n for n, p in tr.policy.named_parameters() if p.requires_grad]

    def weighted(policy):
        w = weights[calls[0]]
        calls[0] += 1
        params = dict(policy.named_parameters())
        scaled = {n: params[n].detach() + w * (params[n] - params[n].detach()) for n in names}
        return torch.nn.utils.stateless._reparametrize_module(policy, scaled)

    with each_ar_pass_within(weighted):
        yield
    if calls[0] and calls[0] != len(weights):
        raise RuntimeError(f"{calls[0]} AR passes for {len(weights)} step weights")


def exact_gradient(
    tr: GRPOTrainer, images: int, seed: int, chunk: int = 24, step_weights: list[float] | None = None
) -> tuple[torch.Tensor, float]:
    """The pathwise gradient of the expected reward w.r.t. the trained parameters (flat, the ascent direction) from
    `images` images of common random numbers `seed`, and their mean reward (margrpo.grpo.gradient_estimates); with
    `step_weights` the gradient through AR step k's own use of the parameters is scaled by w_k (the paths through the
    tokens it commits are not: grpo_step_weights)."""
    return pathwise_gradient(tr, images, seed, chunk, step_scope=partial(_weighted_steps, tr, step_weights))


@torch.no_grad()
def finite_difference(tr: GRPOTrainer, direction: torch.Tensor, h: float, images: int, seed: int) -> float:
    """(f(theta + h v) - f(theta - h v)) / 2h for f = `pathwise_reward(images, seed)` and v = direction / |v|."""
    v = direction / direction.norm()
    start = [p.detach().clone() for p in tr.params]
    values = []
    for sign in (1.0, -1.0):
        offset = 0
        for p, p0 in zip(tr.params, start):
            p.copy_(p0 + sign * h * v[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        values.append(pathwise_reward(tr, images, seed, grad=False))
    for p, p0 in zip(tr.params, start):
        p.copy_(p0)
    return (values[0] - values[1]) / (2 * h)


def pooled_summary(G: torch.Tensor, exact: torch.Tensor, expectation: dict | None, images: int, form: str) -> dict:
    """Over every batch of every seed: the cosine of the mean ascent direction with the exact gradient, and the
    projection of each batch's ascent direction -g_b on the exact direction (mean +- s.e.: an unbiased estimator's
    mean is > 0). With the expectation E[-g] of this form (grpo_expectation): the projections on it against its
    norm (the estimator's own consistency), the noise tr(Cov g), and the batches after which the mean's expected
    cosine with the exact gradient, (E[-g] . e) / sqrt(|E[-g]|^2 + tr(Cov g) / n), reaches 0.5."""
    G = G.double()
    u = exact.double() / exact.double().norm()
    p = -(G @ u)
    out = {
        "batches": len(G),
        "cos_mean": cosine(-G.mean(0), exact),
        "proj_exact_mean": p.mean().item(),
        "proj_exact_se": (p.std() / len(p) ** 0.5).item(),
        "proj_exact_sd": p.std().item(),
    }
    print(
        f"advantages {form}, all {len(G)} batches ({len(G) * images} images): cos(-mean g, exact) "
        f"{out['cos_mean']:+.4f}; projection of -g_b on the exact direction {p.mean():+.5f} +- "
        f"{out['proj_exact_se']:.5f} (s.e.; sd {p.std():.4f}, |g_b| rms {G.norm(dim=1).pow(2).mean().sqrt():.4f})"
    )
    if expectation is not None:
        s = expectation["gradient"].double()
        q = -(G @ (s / s.norm()))
        noise = max(G.norm(dim=1).pow(2).mean().item() - s.norm().item() ** 2, 0.0)
        along = (s @ u).item()  # E[-g] . e
        need = noise / (4 * along**2 - s.norm().item() ** 2) if 4 * along**2 > s.norm().item() ** 2 else float("inf")
        out.update(
            proj_expectation_mean=q.mean().item(),
            proj_expectation_se=(q.std() / len(q) ** 0.5).item(),
            expectation_norm=s.norm().item(),
            noise=noise,
            batches_for_cos_half=need,
        )
        print(
            f"  projection on E[-g]'s direction {q.mean():+.5f} +- {out['proj_expectation_se']:.5f} against |E[-g]| "
            f"{s.norm():.5f}; tr(Cov g) {noise:.4f}; the mean of n batches reaches cos 0.5 with the exact gradient "
            f"at n ~ {need:.3g} batches ({need * images:.3g} images)"
        )
    return out


def grads_file(seed: int, form: str) -> str:
    return f"seed{seed}.pt" if form == "group" else f"seed{seed}-{form}.pt"


def pairwise_cosines(G: torch.Tensor) -> torch.Tensor:
    """The cosines of every ordered pair of G's rows [B * (B - 1)] (a Gram matrix: no B x B x P intermediate)."""
    U = G.double() / G.double().norm(dim=1, keepdim=True)
    return (U @ U.T)[~torch.eye(len(G), dtype=torch.bool)].float()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0).item()


def exact_column(G: torch.Tensor, exact: torch.Tensor, groups: list[int]) -> dict[int, dict[str, float]]:
    """For each n of `groups` (<= len(G)): the cosine between the exact gradient and the ascent direction -mean(g)
    of the first n batches (`prefix`), and the mean of that cosine over the len(G) // n disjoint runs of n
    consecutive batches (`runs`)."""
    out = {}
    for n in groups:
        runs = [cosine(-G[a : a + n].mean(0), exact) for a in range(0, len(G) - n + 1, n)]
        out[n] = {"prefix": runs[0], "runs": sum(runs) / len(runs), "n_runs": len(runs)}
    return out


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
        help="a tiny random policy and toypref, 3 batches, 4 prompts, a small exact gradient and its finite "
        "difference: the code path works",
    )
    p.add_argument("--root", type=Path, default=Path("."))
    p.add_argument("--batches", type=int, help="batches per seed (default 16; --test: 3)")
    p.add_argument(
        "--eta", type=float, nargs="*", default=[0.05, 0.15], help="L2 step lengths to evaluate (none: skip)"
    )
    p.add_argument(
        "--prompts", type=int, default=48, help="training prompts of the expected-reward estimate (x 4 images)"
    )
    p.add_argument(
        "--set", action="append", default=[], help="section.key=value over the spec (grpo, variant, sampling)"
    )
    p.add_argument("--seeds", type=int, nargs="*", help="batch seeds (default: the spec's seed)")
    p.add_argument(
        "--exact", type=int, default=0, help="images of the exact (pathwise) gradient, in two halves (0: skip it)"
    )
    p.add_argument("--exact-seed", type=int, default=1000, help="common random numbers of the exact gradient")
    p.add_argument("--exact-parts", type=int, default=2, help="independent parts of the exact gradient (even)")
    p.add_argument("--exact-file", type=Path, help="the exact gradient's halves: read if it exists, else written")
    p.add_argument(
        "--groups",
        type=int,
        nargs="*",
        help="batch counts of the exact-gradient column (default 1 4 16 64; --test: 1 3)",
    )
    p.add_argument("--json", type=Path, help="write the numbers here")
    p.add_argument(
        "--also-exact",
        type=Path,
        nargs="*",
        default=[],
        help="more exact-gradient files (of --exact-file's format, other --exact-seed): pooled with it, by images",
    )
    p.add_argument(
        "--advantages",
        nargs="+",
        default=["group"],
        choices=ADVANTAGE_FORMS,
        help="advantage forms of the batch gradients, each from the same rollouts (group: the trainer's)",
    )
    p.add_argument(
        "--weighted",
        type=Path,
        help="a file: also the pathwise expectation of GRPO's direction (grpo_step_weights), from the exact "
        "gradient's images (read if it exists, else computed and written)",
    )
    p.add_argument("--from-grads", type=Path, help="read the batch gradients from a --save-grads folder")
    p.add_argument("--save-grads", type=Path, help="a folder: each batch seed's batch gradients [B, P] (seed<S>.pt)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.test:
        args.root = Path(tempfile.mkdtemp(prefix="gradient-signal-test-"))
        args.spec, args.eta, args.prompts = tiny_spec(args.root), [0.05], 4
        args.batches, args.exact, args.groups = args.batches or 3, args.exact or 16, args.groups or [1, 3]
    elif args.spec is None:
        p.error("give a run's spec.json, or --test")
    args.batches = 16 if args.batches is None else args.batches
    args.groups = args.groups or [1, 4, 16, 64]
    tr = build(args.spec, parse_set(args.set), args.root)
    seeds = args.seeds if args.seeds else [tr.cfg.seed]
    record: dict = {"settings": args.set, "batches": args.batches, "seeds": seeds}
    exact = weighted = None
    if args.exact:
        exact = exact_halves(tr, args)
        if args.weighted:  # on the same images as --exact-file's gradient
            weighted = grpo_expectation(tr, args, exact)
        if args.also_exact:
            exact = pooled_exact(exact, args.also_exact)
            if weighted is not None:
                weighted["cos_pooled_exact"] = cosine(weighted["gradient"], exact["gradient"])
                print(f"  E[-g]'s cosine with the pooled exact gradient {weighted['cos_pooled_exact']:+.4f}")
        if weighted is not None:
            record["grpo_expectation"] = {k: v for k, v in weighted.items() if k != "gradient"}
        record["exact"] = {k: v for k, v in exact.items() if k != "gradient"}
    all_grads, forms = [], tuple(args.advantages)
    pooled: dict[str, list[torch.Tensor]] = {f: [] for f in forms}
    for seed in seeds if args.batches else []:
        tr.cfg.seed = seed
        t0 = time.process_time()
        if args.from_grads:  # a --save-grads folder of an earlier run (the same spec, settings and seeds)
            Gs = {f: torch.load(args.from_grads / grads_file(seed, f))[: args.batches] for f in forms}
            rewards = [float("nan")]
        else:
            grads, rewards = zip(*(batch_gradient(tr, b, forms) for b in range(args.batches)))
            stacked = torch.stack(grads)  # [B, P] or [B, F, P]
            Gs = {forms[0]: stacked} if len(forms) == 1 else {f: stacked[:, i] for i, f in enumerate(forms)}
        cpu = time.process_time() - t0
        print(
            f"batch seed {seed}: {args.batches} batches of {tr.cfg.batch_prompts} x {tr.cfg.group_size} images, "
            f"{cpu:.0f} CPU-s; batch reward {sum(rewards) / len(rewards):.4f}; settings {args.set or 'as the spec'}"
        )
        for form, G in Gs.items():
            cos = pairwise_cosines(G)
            label = "" if forms == ("group",) else f"[advantages {form}] "
            print(
                f"{label}pairwise cos of batch gradients: {cos.mean():+.4f} +- {cos.std() / len(cos) ** 0.5:.4f} "
                f"(mean +- s.e. over {len(cos)} ordered pairs); |g_b| {G.norm(dim=1).mean():.4f}, |mean g| "
                f"{G.mean(0).norm():.4f}"
            )
            row = {"seed": seed, "advantages": form, "cpu_s": cpu, "pairwise_cos": cos.mean().item()}
            row["batch_reward"] = sum(rewards) / len(rewards)
            if exact is not None:
                column = exact_column(G, exact["gradient"], [n for n in args.groups if n <= len(G)])
                for n, c in column.items():
                    print(
                        f"  {label}cos(-mean g of {n:3d} batches, exact gradient): {c['prefix']:+.4f} (the first "
                        f"{n}); {c['runs']:+.4f} (mean over {c['n_runs']} disjoint runs of {n})"
                    )
                row["exact_cos"] = column
            record.setdefault("per_seed", []).append(row)
            if exact is not None:
                pooled[form].append(G)
            if args.save_grads:  # every batch gradient, for cosines with other estimates of the exact gradient later
                args.save_grads.mkdir(parents=True, exist_ok=True)
                torch.save(G, args.save_grads / grads_file(seed, form))
        all_grads.append(Gs[forms[0]])
        if args.json:  # after every seed: a long run's finished seeds are kept
            args.json.write_text(json.dumps(record, indent=1))
    if exact is not None and len(seeds) > 1 and args.batches:
        print("exact-gradient column over the batch seeds (mean +- sd of the per-seed values):")
        for form in forms:
            rows = [r for r in record["per_seed"] if r["advantages"] == form]
            for n in args.groups:
                for kind in ("prefix", "runs"):
                    vals = torch.tensor([r["exact_cos"][n][kind] for r in rows if n in r["exact_cos"]])
                    if len(vals):
                        print(
                            f"  advantages {form}, {n:3d} batches, {kind:6s}: {vals.mean():+.4f} +- {vals.std():.4f} "
                            f"({len(vals)} seeds)"
                        )
    if exact is not None and args.batches:
        images = tr.cfg.batch_prompts * tr.cfg.group_size
        for form in forms:
            expectation = weighted if form == "centered" else None
            record.setdefault("pooled", {})[form] = pooled_summary(
                torch.cat(pooled[form]), exact["gradient"], expectation, images, form
            )
        if args.json:
            args.json.write_text(json.dumps(record, indent=1))
    if not args.eta:
        return
    G = torch.cat(all_grads)
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
    changes = {}  # (name, eta) -> the per-image reward change [N] (common random numbers: paired)
    for name, v in directions.items():
        v = v / v.norm()
        for eta in args.eta:
            offset = 0
            with torch.no_grad():  # the trained parameters are leaves that require grad
                for p, p0 in zip(tr.params, start):
                    p.copy_(p0 + eta * v[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
            diff = changes[name, eta] = expected_reward(tr, args.prompts, 4) - r0
            print(f"  {name:26s} eta {eta:.3f}: reward change {mean_se(diff)}")
    with torch.no_grad():
        for p, p0 in zip(tr.params, start):
            p.copy_(p0)
    for eta in args.eta:
        direction, curvature = direction_and_curvature(
            changes["descent (-mean g)", eta], changes["ascent (+mean g)", eta]
        )
        print(f"  eta {eta:.3f}: direction part {mean_se(direction)}, curvature part {mean_se(curvature)}")


def mean_se(x: torch.Tensor) -> str:
    return f"{x.mean():+.4f} +- {x.std() / len(x) ** 0.5:.4f}"


def direction_and_curvature(down: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image, the two parts of the reward changes f(+v) - f(0) and f(-v) - f(0) of a step along the loss's descent
    direction v and along -v: the antisymmetric part (f(+v) - f(-v)) / 2, first order in the step (the direction: > 0
    where the update ascends the reward), and the symmetric part (f(+v) + f(-v)) / 2 - f(0), second order (the
    curvature: < 0 where any move away from a trained policy costs reward, whichever way it points). A drop along
    both directions is curvature, not a wrong sign."""
    return (down - up) / 2, (down + up) / 2


def exact_halves(
    tr: GRPOTrainer, args, file: Path | None = None, weights: list[float] | None = None, label: str = "exact gradient"
) -> dict:
    """The exact gradient from `args.exact` images in `args.exact_parts` independent parts (common random numbers
    exact_seed, exact_seed + 1, ...; read from / written to `args.exact_file`), its stability (the cosine between
    the two halves of the parts; with more than 2 parts, the parts' mean pairwise cosine and their norms: a heavy
    tail shows there) and, under --test, its finite-difference check."""
    file = args.exact_file if weights is None else file
    if file and file.exists():
        saved = torch.load(file)
        parts = saved.get("parts", saved.get("halves"))
        rewards, cpu = saved["rewards"], saved["cpu_s"]
        print(f"{label} read from {file}")
    else:
        t0 = time.process_time()
        P = args.exact_parts
        if P < 2 or P % 2 or args.exact % (4 * P):
            raise SystemExit(f"--exact {args.exact} --exact-parts {P}: an even number of parts of a multiple of 4")
        pairs = [exact_gradient(tr, args.exact // P, args.exact_seed + i, step_weights=weights) for i in range(P)]
        parts, rewards = [h for h, _ in pairs], [r for _, r in pairs]
        cpu = time.process_time() - t0
        if file:
            torch.save({"parts": parts, "rewards": rewards, "cpu_s": cpu, "images": args.exact}, file)
    P = len(parts)
    halves = [torch.stack(parts[: P // 2]).mean(0), torch.stack(parts[P // 2 :]).mean(0)]
    gradient = (halves[0] + halves[1]) / 2
    stability = cosine(halves[0], halves[1])
    out = {
        "images": args.exact,
        "parts": P,
        "half_cos": stability,
        "norm": gradient.norm().item(),
        "reward": sum(rewards) / P,
        "cpu_s": cpu,
        "gradient": gradient,
    }
    print(
        f"{label}: {args.exact} images ({P} parts, common random numbers), {cpu:.0f} CPU-s; mean reward "
        f"{out['reward']:.4f}; |grad| {out['norm']:.4f}; cos between the halves {stability:+.4f}"
    )
    if P > 2:
        Q = torch.stack(parts).double()
        pair = pairwise_cosines(Q)
        loo = [cosine(Q[i], (Q.sum(0) - Q[i]) / (P - 1)) for i in range(P)]
        norms = Q.norm(dim=1)
        out.update(
            part_pairwise_cos=pair.mean().item(),
            part_loo_cos=sum(loo) / P,
            part_norms=norms.tolist(),
        )
        print(
            f"  its {P} parts of {args.exact // P} images: pairwise cos {pair.mean():+.4f} +- {pair.std():.4f} (sd); "
            f"cos of a part with the mean of the others {sum(loo) / P:+.4f} (min {min(loo):+.4f}); part norms "
            f"median {norms.median():.3f}, max {norms.max():.3f}, |mean| {Q.mean(0).norm():.3f}"
        )
    if (
        args.test and weights is None
    ):  # the exact gradient is the derivative of the pathwise reward: a finite difference must agree
        seed = args.exact_seed
        g, _ = exact_gradient(tr, args.exact // 2, seed)
        for name, v in {
            "gradient": g,
            "random": torch.randn(g.shape, generator=torch.Generator().manual_seed(3)),
        }.items():
            fd = finite_difference(tr, v, 1e-3, args.exact // 2, seed)
            print(f"finite difference along the {name} direction: {fd:+.6e}; exact gradient: {cosine_dot(g, v):+.6e}")
        # the per-step weighting splits it: the gradients through each AR step's own use of the parameters add up to it
        K = len(grpo_step_weights(tr))
        one_hot = [
            exact_gradient(tr, args.exact // 2, seed, step_weights=[float(i == k) for i in range(K)])[0]
            for k in range(K)
        ]
        split = (torch.stack(one_hot).sum(0) - g).norm() / g.norm()
        print(f"per-AR-step split of the exact gradient: |sum of the {K} steps' parts - exact| / |exact| {split:.2e}")
    return out


def grpo_expectation(tr: GRPOTrainer, args, exact: dict) -> dict:
    """The expectation of GRPO's batch ascent direction -g with centred advantages (grpo_step_weights), pathwise from
    the exact gradient's images and noise, in the loss's units; its cosine with the exact gradient is the bias that
    GRPO's credit (the per-step token means) puts into the direction."""
    weights = grpo_step_weights(tr)
    G_, K, T = tr.cfg.group_size, len(weights), stochastic_steps(tr.sampling)
    if T != tr.sampling.diffusion_steps:
        print("  (the last diffusion step is not scored: GRPO misses its term, which this expectation includes)")
    out = exact_halves(tr, args, args.weighted, weights, "GRPO-weighted pathwise gradient")
    scale = (G_ - 1) / G_ / (K * T)
    out["gradient"] = out["gradient"] * scale
    out["norm"] = out["gradient"].norm().item()
    out["cos_exact"] = cosine(out["gradient"], exact["gradient"])
    out["step_weights"] = weights
    print(
        f"  E[-g] of centred advantages = {G_ - 1}/{G_} / ({K} x {T}) x sum_k P_k / n_k (n_k = "
        f"{[round(1 / w) for w in weights]}): |E[-g]| {out['norm']:.5f}; cos with the exact gradient "
        f"{out['cos_exact']:+.4f}"
    )
    return out


def pooled_exact(exact: dict, files: list[Path]) -> dict:
    """`exact` (exact_halves) pooled with the exact gradients saved in `files`, each weighted by its images; prints
    the cosine between each file's gradient and `exact`'s (independent estimates of one gradient)."""
    total, images = exact["gradient"].double() * exact["images"], exact["images"]
    for f in files:
        saved = torch.load(f)
        g = torch.stack(saved.get("parts", saved.get("halves"))).double().mean(0)
        print(
            f"exact gradient of {f} ({saved['images']} images): cos with the first {cosine(g, exact['gradient']):+.4f}"
        )
        exact.setdefault("files_cos", []).append(cosine(g, exact["gradient"]))
        total, images = total + g * saved["images"], images + saved["images"]
    pooled = (total / images).float()
    print(f"pooled exact gradient: {images} images, |grad| {pooled.norm():.4f}")
    return {**exact, "images": images, "norm": pooled.norm().item(), "gradient": pooled}


def cosine_dot(g: torch.Tensor, v: torch.Tensor) -> float:
    """The directional derivative g . v / |v|."""
    return (g.double() @ v.double() / v.double().norm()).item()


if __name__ == "__main__":
    main()
