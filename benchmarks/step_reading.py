"""What a reader of one GRPO step has to follow: the files and functions of margrpo that one step passes through
(with a validation before and after it and a checkpoint, as a run's first step), and the calls from `train_step`
down to the diffusion head in the update's replay (issue 52 counted 10 before its change).

Traced with `sys.setprofile` on the tiny toy policy of the tests, one process, the gradient-variance probe on; the
same script runs on older commits (it builds the trainer from fields every version has).

    python benchmarks/step_reading.py [--variant fix|mte|sim|grpo]
"""

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import PROMPTS, redness, tiny_policy  # noqa: E402

import margrpo  # noqa: E402
from margrpo.grpo.rollout import SamplingConfig  # noqa: E402
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer  # noqa: E402
from margrpo.prompts.suites import PromptSet  # noqa: E402

PACKAGE = str(Path(margrpo.__file__).parent)
VARIANTS = {
    "grpo": {},
    "fix": {"freeze_head": True},
    "mte": {"freeze_head": True, "trajectories": 3},
    "sim": {"freeze_head": True, "trajectories": 3, "sim": True},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="fix", choices=list(VARIANTS))
    args = p.parse_args()
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    cfg = dict(steps=1, batch_prompts=2, group_size=2, mask_steps=3, diffusion_steps=3, val_prompts=2, precision="no")
    cfg.update(VARIANTS[args.variant], trackers=())
    if "grad_variance" in fields:  # before issue 52 the statistic was always on
        cfg["grad_variance"] = True
    prompts = PromptSet(PROMPTS, [{}] * len(PROMPTS))
    sampling = SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=2.0)
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(tiny_policy("flow", seed=1), redness, prompts, prompts, sampling, GRPOConfig(**cfg), out)
        functions, chain = set(), []

        def trace(frame, event, arg):
            if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
                return
            code = frame.f_code
            functions.add((Path(code.co_filename).relative_to(PACKAGE).as_posix(), code.co_qualname))
            if not chain and code.co_name == "head" and "policy" in code.co_filename:
                f, calls = frame, []  # the first head call of the update's replay (not the rollout's)
                while f is not None:
                    if f.f_code.co_filename.startswith(PACKAGE):
                        calls.append(f"{Path(f.f_code.co_filename).stem}.{f.f_code.co_qualname}")
                    if f.f_code.co_name == "train_step":
                        if any(c.endswith("micro_loss") for c in calls):
                            chain.extend(reversed(calls))
                        break
                    f = f.f_back

        torch.set_num_threads(1)
        sys.setprofile(trace)
        try:
            trainer.train()
        finally:
            sys.setprofile(None)
    files = sorted({f for f, _ in functions})
    print(f"variant {args.variant}: one step with two validations and a checkpoint")
    print(f"  {len(files)} files, {len(functions)} functions of margrpo")
    print(f"  train_step -> head: {len(chain) - 1} calls: " + " -> ".join(chain))
    for f in files:
        print(f"    {f}: " + ", ".join(sorted(q for g, q in functions if g == f)))


if __name__ == "__main__":
    main()
