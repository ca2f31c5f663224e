"""MARVAL on a pre-trained toy-nova: distil, then compare the one-step student with its teacher.

Prints (and writes to --out/report.json): rollout speed in images/s of the teacher's T-step chain and
of the one-step policy through the same `rollout.generate` (and through `generate_one_step`), the
world's exact scores (`evaluation.quality.quality_report`) of the teacher, the undistilled student
(the teacher head read once at t = 1) and the distilled student on the evaluation suite, and the
moment distance of the student's tokens to the teacher's at the same z.

    PYTHONPATH=src python benchmarks/marval_toy.py --teacher results/pretrain/toy-nova-<hash8>/policy \
        --data results/data/shapesworld-<hash8> --steps 300 --out /tmp/marval
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from margrpo.evaluation.quality import quality_report
from margrpo.grpo.rollout import SamplingConfig, generate
from margrpo.infra.files import read_json
from margrpo.policy import load_policy
from margrpo.prompts.suites import PromptSet, load_suite
from margrpo.related.marval import MARVALConfig, MARVALDistiller, generate_one_step, one_step_policy, teacher_distance
from margrpo.related.marval.distill import draw_rows
from margrpo.world import WorldConfig


def images_per_s(fn, prompts, repeats: int = 3) -> float:
    fn(prompts[:4])  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn(prompts)
    return repeats * len(prompts) / (time.perf_counter() - t0)


def speed(teacher, student, t_sampling, s_sampling, prompts) -> dict:
    def g():
        return torch.Generator().manual_seed(0)

    with torch.no_grad():
        return {
            "teacher_rollout": images_per_s(lambda p: generate(teacher, p, t_sampling, generator=g()), prompts),
            "one_step_rollout": images_per_s(lambda p: generate(student, p, s_sampling, generator=g()), prompts),
            "one_step_generate": images_per_s(
                lambda p: generate_one_step(student, p, s_sampling, generator=g()), prompts
            ),
        }


def quality(policy, records, sampling, world) -> dict:
    report, _ = quality_report(policy, records, sampling, images_per_prompt=2, world_cfg=world, precision="no")
    return {
        "strict": report["overall"]["strict"],
        "lenient": report["overall"]["lenient"],
        "single_object_accuracy": report["single_object_color_and_shape"]["accuracy"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--teacher", required=True)
    ap.add_argument("--data", required=True, help="the suites' folder (train / eval .jsonl, world.json)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--objective", default="sim")
    ap.add_argument("--out", default="/tmp/marval")
    ap.add_argument("--lr", type=float, default=MARVALConfig.lr)
    ap.add_argument("--fake-lr", type=float, default=MARVALConfig.fake_lr)
    ap.add_argument("--regression-weight", type=float, default=MARVALConfig.regression_weight)
    ap.add_argument("--warm-start", type=int, default=MARVALConfig.warm_start)
    ap.add_argument("--regression-rows", type=int, default=MARVALConfig.regression_rows)
    ap.add_argument("--batch-prompts", type=int, default=MARVALConfig.batch_prompts)
    ap.add_argument(
        "--skip-teacher", action="store_true", help="no speed and teacher quality (measured by an earlier run)"
    )
    ap.add_argument("--teacher-ode", action="store_true", help="also score the teacher's ODE sampler (noise_level 0)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    teacher = load_policy(args.teacher).eval()
    spec = read_json(Path(args.teacher).parent / "spec.json")
    t_sampling = SamplingConfig(**spec["policy_json"]["sampling"])
    s_sampling = dataclasses.replace(t_sampling, diffusion_steps=2, cfg_scale=1.0)  # guidance is distilled in
    world = WorldConfig.from_dict(read_json(Path(args.data) / "world.json"))
    train = load_suite(Path(args.data) / "train.jsonl")
    records = load_suite(Path(args.data) / "eval.jsonl")
    report = {
        "teacher": args.teacher,
        "teacher_sampling": dataclasses.asdict(t_sampling),
        "student_sampling": dataclasses.asdict(s_sampling),
        "threads": args.threads,
    }

    if not args.skip_teacher:
        student0 = one_step_policy(teacher).eval()
        report["speed_images_per_s"] = speed(
            teacher, student0, t_sampling, s_sampling, [r.prompt for r in records[:32]]
        )
        print("speed", report["speed_images_per_s"], flush=True)
        report["quality_teacher"] = quality(teacher, records, t_sampling, world)
        report["quality_student_step0"] = quality(student0, records, s_sampling, world)
        print("teacher", report["quality_teacher"], "student@0", report["quality_student_step0"], flush=True)

    if args.teacher_ode:  # the regression targets' sampler
        report["quality_teacher_ode"] = quality(
            teacher, records, dataclasses.replace(t_sampling, noise_level=0.0), world
        )
        print("teacher ODE", report["quality_teacher_ode"], flush=True)
    config = MARVALConfig(
        steps=args.steps,
        objective=args.objective,
        save_every=100,
        lr=args.lr,
        fake_lr=args.fake_lr,
        regression_weight=args.regression_weight,
        warm_start=args.warm_start,
        batch_prompts=args.batch_prompts,
        regression_rows=args.regression_rows,
    )
    report["marval"] = dataclasses.asdict(config)
    distiller = MARVALDistiller(teacher, t_sampling, config)
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        probe = draw_rows(
            generate_one_step(
                distiller.student, [r.prompt for r in records[:16]], t_sampling, generator=g, with_uncond=True
            ),
            128,
            g,
        )
    report["distance_step0"] = teacher_distance(distiller.teacher_head, distiller.student, probe)
    t0 = time.time()
    rows = distiller.train(PromptSet([r.prompt for r in train], [{}] * len(train)), args.out)
    report["distill_time_s"] = time.time() - t0
    report["distance_final"] = teacher_distance(distiller.teacher_head, distiller.student, probe)
    report["quality_student_final"] = quality(distiller.student.eval(), records, s_sampling, world)
    report["distill_last_rows"] = rows[-3:]
    report["distill_trace"] = [{k: r[k] for k in ("step", "var_loss", "reg_loss", "fake_loss")} for r in rows[9::10]]
    print(json.dumps(report, indent=1), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
