"""The discrete toy-mask policy: pre-training loss, CompBench-style accuracy, and seconds per RL step.

    python benchmarks/toy_mask.py --steps 600 [--out /tmp/toy-mask] [--rl-steps 3]
    python benchmarks/toy_mask.py --policy /tmp/toy-mask --no-eval --rl-steps 5   # RL timings only

Pre-trains a default-size toy-mask policy on the pipeline's default world (`grid4`: 64 px, 4 x 4 cells)
for --steps steps on one thread, prints the loss at a few points and the exact CompBench-style score
(strict / lenient per category, and a shuffled-prompt baseline) of one image per prompt of a
96-prompt evaluation suite; then times --rl-steps steps of plain GRPO and of MaskGRPO at 3 prompts
x 4 images with the verifiable `shapes` reward (strict), starting from the pre-trained policy (plain
GRPO twice: scoring all K unmasking steps per update, and one step per update, which costs one
forward pass per update as MaskGRPO does).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rl-steps", type=int, default=3)
    p.add_argument("--cfg-scale", type=float, default=2.0)
    p.add_argument("--out", default=None, help="save the pre-trained policy here")
    p.add_argument("--policy", default=None, help="load this pre-trained toy-mask policy instead of pre-training one")
    p.add_argument("--no-eval", action="store_true", help="skip the CompBench-style evaluation")
    args = p.parse_args()
    torch.set_num_threads(1)
    from margrpo.prompts.shapesworld import build_suites

    policy = load_or_pretrain(args)
    suites = build_suites(policy.world, seed=0, n_train=300, n_val=24, n_eval=96)
    if not args.no_eval:
        evaluate(policy, suites["eval"], args.cfg_scale)
    time_rl(policy, suites["train"], args)


def load_or_pretrain(args):

    from margrpo.policy.toy import count_parameters
    from margrpo.related.maskgrpo.policy import ToyMaskConfig, ToyMaskPolicy
    from margrpo.related.maskgrpo.pretraining import MaskPretrainConfig, pretrain_mask_policy
    from margrpo.world import prompt_vocabulary

    if args.policy:
        return ToyMaskPolicy.from_pretrained(args.policy)
    torch.manual_seed(0)
    policy = ToyMaskPolicy(ToyMaskConfig(vocab=prompt_vocabulary()))
    print(
        f"toy-mask: {count_parameters(policy) / 1e6:.2f}M parameters, {policy.seq_len} tokens, "
        f"codebook {policy.vocab_size}"
    )
    t0 = time.time()
    rows = pretrain_mask_policy(policy, MaskPretrainConfig(steps=args.steps, batch_size=args.batch_size))
    minutes = (time.time() - t0) / 60
    for r in rows[:: max(1, len(rows) // 6)] + rows[-1:]:
        print(f"  step {r['step']:5d}  loss {r['loss']:.4f}")
    last = sum(r["loss"] for r in rows[-20:]) / len(rows[-20:])
    print(
        f"pre-training: {args.steps} steps x {args.batch_size} in {minutes:.1f} min; "
        f"loss (mean of the last 20 steps) {last:.4f}"
    )
    if args.out:
        policy.save_pretrained(args.out)
    return policy


def evaluate(policy, records, cfg_scale: float) -> None:
    from margrpo.related.maskgrpo.pretraining import compbench_accuracy
    from margrpo.related.maskgrpo.rollout import MaskSamplingConfig

    for selection in ("random", "confidence"):
        report = compbench_accuracy(policy, records, MaskSamplingConfig(cfg_scale=cfg_scale, selection=selection))
        print(f"CompBench-style (eval suite, {report['n_images']} images, selection={selection}, cfg={cfg_scale}):")
        print(json.dumps(report, indent=1))


def time_rl(policy, records, args) -> None:
    from margrpo.prompts.suites import PromptSet
    from margrpo.related.maskgrpo.rollout import MaskSamplingConfig
    from margrpo.related.maskgrpo.trainer import MaskGRPOConfig, train_mask_grpo
    from margrpo.rewards.registry import build_reward_mix

    reward = build_reward_mix({"shapes": 1.0}, {"shapes": {"world": policy.world.to_dict()}})
    train = PromptSet([r.prompt for r in records], [{"spec": r.spec, "category": r.category} for r in records])
    for method, mask_steps in (("grpo", None), ("grpo", 1), ("mask_grpo", None)):
        cfg = MaskGRPOConfig(method=method, steps=args.rl_steps, batch_prompts=3, group_size=4, mask_steps=mask_steps)
        rl_rows = train_mask_grpo(
            copy.deepcopy(policy), reward, train, cfg, sampling=MaskSamplingConfig(cfg_scale=args.cfg_scale)
        )
        times = [r["step_time_s"] for r in rl_rows]
        print(
            f"{method} (mask_steps={mask_steps}): seconds per RL step (3 prompts x 4 images, mu={cfg.iterations}): "
            f"{', '.join(f'{t:.2f}' for t in times)}; rewards {[round(r['reward_mean'], 3) for r in rl_rows]}"
        )


if __name__ == "__main__":
    main()
