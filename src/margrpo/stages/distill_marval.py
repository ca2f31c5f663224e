"""`margrpo distill-marval`: distil a toy-nova teacher's diffusion head into a one-step policy (MARVAL), with
its quality report.

    margrpo distill-marval --teacher results/pretrain/toy-nova-<hash8>/policy --suites-dir results/data/<...> \
        --policy-json '{"kind": "toy-marval", "teacher": "toy-nova", "distill": {...}, "sampling": {...}}' \
        --out-dir DIR/policy --quality DIR/quality.json

`distill` holds MARVALConfig fields; `sampling` is the one-step policy's own sampling (the schema's
`policies.*.sampling`; for a one-step head: diffusion_steps 2, cfg_scale 1, as docs/marval.md says).
The teacher's sampling (its K, CFG scale and schedule, which the distillation matches) is read from the
spec.json that `margrpo pretrain` wrote beside the teacher's policy folder.

Writes DIR/policy (a ToyMAR folder with `head_sampler: one_step`; loads with margrpo.policy.load_policy and
runs through `margrpo sample` / `margrpo train` unchanged), the quality report (the world's exact scorer on
the suite's eval.jsonl, `evaluation.quality.quality_report`, as benchmarks/marval_toy.py measures it),
DIR/state/ (the distiller's snapshots and metrics.csv) and DIR/spec.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from margrpo.infra.files import InputError
from margrpo.infra.readers import dataclass_from
from margrpo.stages._common import prompt_set, sampling_config, setup, stage_args, write_spec
from margrpo.stages._related import policy_entry, teacher_sampling

log = logging.getLogger(__name__)
ENTRY_KEYS = ("kind", "teacher", "distill", "sampling")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--teacher", required=True, help="the teacher's policy folder (a toy-nova ToyMAR: flow head predicting x0)"
    )
    p.add_argument(
        "--suites-dir", required=True, help="folder with train.jsonl (distillation prompts), eval.jsonl and world.json"
    )
    p.add_argument(
        "--policy-json", required=True, help="the policy's config entry (kind: toy-marval, teacher, distill, sampling)"
    )
    p.add_argument("--out-dir", required=True, help="the one-step policy folder; state/ and spec.json go beside it")
    p.add_argument("--quality", required=True, help="quality report JSON (exact scorer on eval.jsonl)")
    p.add_argument("--quality-images", type=int, default=2, help="images per eval prompt for the quality report")
    p.add_argument("--threads", type=int, default=None)


def read_entry(text: str):
    """(MARVALConfig, the student's SamplingConfig, the teacher's name) of the --policy-json entry."""
    from margrpo.related.marval import MARVALConfig

    entry = policy_entry(text, "toy-marval", ENTRY_KEYS, "distill-marval")
    config = dataclass_from(MARVALConfig, entry.get("distill"), "--policy-json: distill")
    return config, sampling_config(entry.get("sampling", {})), entry.get("teacher")


def load_teacher(path: str, device):
    from margrpo.policy import ToyMAR, load_policy

    teacher = load_policy(path, device)
    if not isinstance(teacher, ToyMAR) or teacher.config.head_type != "flow" or teacher.config.head_prediction != "x0":
        raise InputError(
            f"{path}: MARVAL distils a toy MAR with a flow head that predicts x0 (toy-nova); got "
            f"{type(teacher).__name__}"
            + (f" with head_type {teacher.config.head_type!r}" if isinstance(teacher, ToyMAR) else "")
        )
    return teacher.eval()


def run(args) -> None:
    from margrpo.evaluation.quality import format_report, quality_report
    from margrpo.infra.files import atomic_write_json
    from margrpo.prompts.suites import load_suite
    from margrpo.related.marval import MARVALDistiller
    from margrpo.stages.pretrain import load_world, write_policy

    config, sampling, teacher_name = read_entry(args.policy_json)
    t_sampling = teacher_sampling(args.teacher)
    suites = Path(args.suites_dir)
    device = setup(args.threads)
    out = Path(args.out_dir)
    write_spec(out.parent, {**stage_args(args), "teacher_sampling": dataclasses.asdict(t_sampling)})
    distiller = MARVALDistiller(load_teacher(args.teacher, device), t_sampling, config)
    rows = distiller.train(prompt_set(suites / "train.jsonl"), out.parent / "state")
    student = distiller.student.eval()
    write_policy(student, out)
    world = load_world(suites / "world.json") if (suites / "world.json").is_file() else None
    report, _ = quality_report(
        student, load_suite(suites / "eval.jsonl"), sampling, args.quality_images, world_cfg=world, precision="no"
    )
    report.update(
        teacher=teacher_name,
        teacher_dir=args.teacher,
        distill=dataclasses.asdict(config),
        sampling=dataclasses.asdict(sampling),
        teacher_sampling=dataclasses.asdict(t_sampling),
        distill_last=rows[-1] if rows else None,
    )
    atomic_write_json(args.quality, report)
    log.info(format_report(report))
