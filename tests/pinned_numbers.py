"""The numbers a refactor must not move: four short runs of the tiny toy (+Fix, +MTE, +Sim, and GRPO replayed in
chunks with two updates per rollout), their logged rows without timings, and their trained weights.

`python tests/pinned_numbers.py OUT.json` writes them; tests/data/pinned-numbers.json holds them as the code of
044f26d (before issue 69's refactor) made them, and tests/test_pinned_numbers.py compares today's code with it.
The script uses only what both revisions have (tests/helpers.make_trainer), so it runs on either."""

import hashlib
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from margrpo.infra.kernels import apply_caps

apply_caps()  # the kernels every stage and the test process run (tests/conftest.py), set before torch loads
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import make_trainer  # noqa: E402

RUNS = {
    "fix": dict(freeze_head=True),
    "mte": dict(freeze_head=True, trajectories=3),
    "sim": dict(freeze_head=True, trajectories=2, sim=True, tau=0.0),
    "grpo_chunked": dict(replay_chunk=2, updates_per_rollout=2),
}
TIMINGS = {"step_time_s", "peak_mem_mb"}  # what the machine's load moves, not the code


def cpu() -> str:
    """The CPU the numbers came from: float results of CPU kernels differ between CPU models and instruction sets."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor()
    keep = ("Vendor ID", "CPU family", "Model", "Model name", "Flags")
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    return " | ".join(f"{k}: {fields[k].strip()}" for k in keep if k in fields)


def run(settings: dict) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: no reduction order that depends on the machine's cores
    try:
        with tempfile.TemporaryDirectory() as d:
            trainer = make_trainer(Path(d), steps=4, **settings)
            rows = [{k: v for k, v in row.items() if k not in TIMINGS} for row in trainer.train()]
            params = {name: p.detach().double() for name, p in trainer.policy.named_parameters()}
    finally:
        torch.set_num_threads(threads)
    digest = hashlib.sha256()
    for name in sorted(params):
        digest.update(name.encode() + params[name].float().numpy().tobytes())
    return {
        "rows": rows,
        "weights": {name: [p.sum().item(), p.square().sum().item()] for name, p in sorted(params.items())},
        "weights_sha256": digest.hexdigest(),
    }


def numbers() -> dict:
    return {"cpu": cpu(), "torch": torch.__version__, "runs": {name: run(s) for name, s in RUNS.items()}}


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(numbers(), indent=1) + "\n")
