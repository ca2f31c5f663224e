"""`margrpo pretrain-mask`: the discrete toy-mask base policy (MaskGIT-style) trained on ShapesWorld, with its
quality report.

    margrpo pretrain-mask --world world.json --eval-suite eval.jsonl --out-dir DIR/policy --quality DIR/quality.json \
        --policy-json '{"kind": "toy-mask", "model": {...}, "pretrain": {...}, "sampling": {...}}'

`model` holds ToyMaskConfig fields (the world comes from --world, the vocabulary from the world's prompts),
`pretrain` MaskPretrainConfig fields and `sampling` MaskSamplingConfig fields (the quality report's
sampler). Writes DIR/policy (atomically; loads with margrpo.policy.load_policy), the quality report,
DIR/state/log.csv (the pre-training loss per step) and DIR/spec.json. No resume: pre-training is short.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from margrpo.infra.readers import dataclass_from
from margrpo.stages._common import setup, stage_args, write_spec
from margrpo.stages._related import mask_sampling, policy_entry

log = logging.getLogger(__name__)
ENTRY_KEYS = ("kind", "model", "pretrain", "sampling")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--world", required=True, help="world.json written by make-suites (a snapped world, e.g. --preset grid4)"
    )
    p.add_argument("--eval-suite", required=True, help="suite for the quality report (eval.jsonl)")
    p.add_argument(
        "--policy-json", required=True, help="the policy's config entry (kind: toy-mask, model, pretrain, sampling)"
    )
    p.add_argument(
        "--out-dir", required=True, help="policy folder (save_pretrained); log.csv and spec.json go beside it"
    )
    p.add_argument(
        "--quality", required=True, help="quality report JSON (overall and per-category scores, shuffled baseline)"
    )
    p.add_argument("--quality-images", type=int, default=2, help="images per eval prompt for the quality report")
    p.add_argument("--threads", type=int, default=None)


def read_entry(text: str):
    """(ToyMaskConfig fields, MaskPretrainConfig, MaskSamplingConfig) of the --policy-json entry."""
    from margrpo.related.maskgrpo.pretraining import MaskPretrainConfig

    entry = policy_entry(text, "toy-mask", ENTRY_KEYS, "pretrain-mask")
    pretrain = dataclass_from(MaskPretrainConfig, entry.get("pretrain"), "--policy-json: pretrain")
    return entry.get("model", {}), pretrain, mask_sampling(entry.get("sampling"), "--policy-json: sampling")


def run(args) -> None:
    import torch

    from margrpo.evaluation.quality import format_report
    from margrpo.infra.files import atomic_write_json, atomic_write_rows
    from margrpo.policy.toy import count_parameters
    from margrpo.prompts.suites import load_suite
    from margrpo.related.maskgrpo.policy import ToyMaskConfig, ToyMaskPolicy
    from margrpo.related.maskgrpo.pretraining import compbench_accuracy, pretrain_mask_policy
    from margrpo.stages.pretrain import load_world, write_policy
    from margrpo.world import prompt_vocabulary

    model, pretrain, sampling = read_entry(args.policy_json)
    world_cfg = load_world(args.world)
    model_cfg = dataclass_from(
        ToyMaskConfig,
        model,
        "--policy-json: model",
        fixed={"world": world_cfg.to_dict(), "vocab": prompt_vocabulary()},
    )
    device = setup(args.threads)
    out = Path(args.out_dir)
    write_spec(out.parent, {**stage_args(args), "world": world_cfg.to_dict()})
    torch.manual_seed(pretrain.seed)
    policy = ToyMaskPolicy(model_cfg).to(device)
    log.info(
        f"toy-mask: {count_parameters(policy) / 1e6:.2f}M parameters, {policy.seq_len} tokens, "
        f"codebook {policy.vocab_size}"
    )
    rows = pretrain_mask_policy(policy, pretrain)
    atomic_write_rows(out.parent / "state" / "log.csv", rows)
    write_policy(policy, out)
    report = compbench_accuracy(policy, load_suite(args.eval_suite), sampling, args.quality_images)
    report.update(
        pretrain=dataclasses.asdict(pretrain), sampling=dataclasses.asdict(sampling), final_loss=rows[-1]["loss"]
    )
    atomic_write_json(args.quality, report)
    log.info(format_report(report))
