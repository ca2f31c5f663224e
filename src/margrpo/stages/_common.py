"""Small helpers shared by the stage entry points (argument parsing, devices, suites, rewards)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
from pathlib import Path

from margrpo.infra.files import InputError

DISTRIBUTED_ENV = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)  # what torchrun / accelerate launch set


def _check_distributed_env(data_parallel: bool) -> None:
    """A launcher's variables left in the shell: a single-process stage names them (else accelerate fails far from
    the cause); a data-parallel stage needs the whole set."""
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) < 1:
        raise InputError(f"environment variable WORLD_SIZE={world!r}: expected a positive process count")
    if int(world) == 1:
        return
    if not data_parallel:
        raise InputError(
            f"environment variable WORLD_SIZE={world} asks for {world} processes, but this stage runs as one "
            "(only `margrpo train` runs data parallel); unset WORLD_SIZE (left from torchrun or accelerate launch?)"
        )
    missing = [k for k in DISTRIBUTED_ENV if k not in os.environ]
    if missing:
        raise InputError(
            f"environment variable WORLD_SIZE={world} asks for {world} processes, but {', '.join(missing)} "
            "is not set: start the job with `python -m margrpo.infra.launch N margrpo train ...`, or unset WORLD_SIZE"
        )


def setup(threads: int | None, device: str = "auto", data_parallel: bool = False):
    """Thread count for CPU jobs (Snakemake runs several in parallel) and the device to use. `data_parallel`: the
    stage may run as one of several processes (WORLD_SIZE > 1); every other stage refuses an inherited WORLD_SIZE."""
    import torch

    _check_distributed_env(data_parallel)

    os.environ["HF_HUB_OFFLINE"] = "1"  # forced: a stage never reaches for a hub, whatever the shell says
    if threads:
        torch.set_num_threads(threads)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("the config asks for device: cuda, but no CUDA device is visible; set device: cpu or auto")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # started by torchrun / accelerate launch: one of several processes
        import torch.distributed as dist

        from margrpo.grpo.engine import join_process_group

        own = join_process_group(device)  # this process's GPU; "cuda" now means it too
        rank, world, host = dist.get_rank(), dist.get_world_size(), os.uname().nodename
        print(f"margrpo: process {rank} of {world} on {host} (local {os.environ['LOCAL_RANK']})", flush=True)
        if rank:  # one log per job: the other processes report warnings only
            logging.getLogger().setLevel(logging.WARNING)
        return own
    return torch.device(device)


def json_arg(text: str, what: str, section: str | None = None) -> dict:
    """A `--*-json` argument as a dict; with `section` (a schema path such as "policies.*.sampling")
    it is validated against that part of the config schema and its defaults are filled."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{what}: not valid JSON ({err})") from None
    if not isinstance(value, dict):
        raise InputError(f"{what}: expected a JSON object")
    if section is not None:
        from margrpo.experiment.config import validate_section

        value = validate_section(value, section, what)
    return value


def sampling_config(d: dict):
    """SamplingConfig from a config's `sampling` section, validated (unknown keys and bad values are errors)."""
    from margrpo.experiment.config import validate_section
    from margrpo.grpo.rollout import SamplingConfig

    return SamplingConfig(**validate_section(d, "policies.*.sampling", "sampling"))


def git_revision() -> str:
    """The revision of the code that ran (the package's checkout, wherever the job's working directory is)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_spec(folder: str | Path, spec: dict) -> dict:
    """`<folder>/spec.json`: what this stage ran with (its resolved settings and inputs), the git revision and the
    CPU kernels (infra/kernels.py), written atomically beside the outputs it explains. Returns what it wrote."""
    from margrpo.infra.files import atomic_write_json
    from margrpo.infra.kernels import kernel_record

    record = {**spec, "git_rev": git_revision(), "kernels": kernel_record()}
    atomic_write_json(Path(folder) / "spec.json", record, indent=1)
    return record


def run_spec(spec: dict, args) -> dict:
    """A training run's full spec: its settings, its seed and its inputs (whose folder names carry their own
    settings' hashes); its state/ is resumed only under the same spec."""
    inputs = {k: getattr(args, k) for k in ("policy_dir", "suites_dir", "toyclip_dir", "toypref_dir")}
    return {**spec, "seed": args.seed, "inputs": inputs}


def stage_args(args) -> dict:
    """A stage's command-line arguments as a spec (paths as strings, `--*-json` values parsed)."""
    return {
        k: json.loads(v) if k.endswith("_json") and isinstance(v, str) else v
        for k, v in vars(args).items()
        if not k.startswith("_") and k != "stage"
    }


def prompt_set(path: str | Path):
    """A suite file as a PromptSet (prompts + per-prompt metadata: category and spec)."""
    from margrpo.prompts.suites import PromptSet, load_suite

    records = load_suite(path)
    return PromptSet([r.prompt for r in records], [{"category": r.category, "spec": r.spec} for r in records])


def reward_options(
    weights: dict, reward_models: dict, toyclip_dir: str | None, toypref_dir: str | None = None
) -> dict:
    """Per-scorer constructor options: local weight paths from the config; the toy models from the pipeline."""
    options = {name: dict(reward_models.get(name, {})) for name in weights}
    for name, path in (("toyclip", toyclip_dir), ("toypref", toypref_dir)):
        if name in weights:
            if path is None:
                raise InputError(
                    f"reward {name!r} is trained by the pipeline: "
                    f"pass --{name}-dir (the folder `margrpo train-{name}` wrote)"
                )
            options[name] = {"path": path, **options[name]}
    return {k: v for k, v in options.items() if v}
