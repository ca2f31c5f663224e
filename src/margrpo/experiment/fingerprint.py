"""What a shipped toy stage's code computes, as one hash: the release's test of "did this change move a number?".

A shipped stage is current while its code digest (`weights.source_digest`) is the one it was packed with. A refactor
moves the digest and leaves every number alone; retraining the release for it costs ~an hour of CPU. So a changed
stage is run twice on a fixed, smoke-sized input, once with the code the release was packed from and once with
today's, on this machine (one CPU, one set of kernels: bits can be compared), and the outputs' tensors and numbers
hashed. Equal hashes prove the change moves no number of that stage on that input: today's digest is recorded as
equivalent (`margrpo refresh-release`). Unequal hashes mean the stage must be retrained (`make toy-weights`).

The input is the smoke config's: its world and suites, its toyclip / toypref settings, its toy-nova (flow head)
and toy-harmon (ddpm head) architectures, every code path of the default stages at a few steps.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # the checkout this package runs from (git worktrees are made of it)
SMOKE = REPO / "config" / "smoke.yaml"
_TIMING = ("second", "time", "wall", "_s")  # metrics keys that measure the machine, not the model


def stage_commands(config: dict, stage: str, policy: str | None, work: Path) -> list[list[str]]:
    """The `margrpo` command lines that compute `stage` (toyclip, toypref, or pretrain of `policy`) from scratch on
    `config`'s settings in `work`, its data stage first."""
    from margrpo.experiment.specs import pretrain_settings

    data, w = work / "data", config["world"]
    prompts = config["prompts"]
    make = ["make-suites", "--out-dir", str(data), "--seed", str(prompts.get("seed", 0))]
    make += ["--n-train", str(prompts["n_train"]), "--n-val", str(prompts["n_val"])]
    make += ["--n-eval", str(prompts["n_eval"])]
    make += [arg for k, v in w.items() for arg in (f"--{k.replace('_', '-')}", str(v).lower())]  # as the data rule
    toyclip = ["train-toyclip", "--world", str(data / "world.json"), "--config-json", json.dumps(config["toyclip"])]
    toyclip += ["--out-dir", str(work / "toyclip"), "--metrics", str(work / "toyclip.json")]
    toypref = ["train-toypref", "--world", str(data / "world.json"), "--toyclip-dir", str(work / "toyclip")]
    toypref += ["--config-json", json.dumps(config["toypref"]), "--out-dir", str(work / "toypref")]
    toypref += ["--metrics", str(work / "toypref.json")]
    runs = {"toyclip": [make, toyclip], "toypref": [make, toyclip, toypref]}
    if stage in runs:
        return runs[stage]
    if stage != "pretrain" or policy not in config["policies"]:
        raise ValueError(f"no fingerprint for stage {stage!r} of policy {policy!r}")
    pre = ["pretrain", "--world", str(data / "world.json"), "--eval-suite", str(data / "eval.jsonl")]
    spec = json.dumps(pretrain_settings(config["policies"][policy]))
    pre += ["--policy-json", spec, "--out-dir", str(work / "policy")]
    pre += ["--quality", str(work / "quality.json"), "--precision", "no"]
    return [make, pre]


def fingerprint(code_root: str | Path, stage: str, policy: str | None = None, config: str | Path = SMOKE) -> str:
    """sha256 of what `stage` computes on `config` with the package under `code_root` (a checkout: its `src/` is put
    first on PYTHONPATH), in a fresh temporary folder and fresh processes, one thread."""
    from margrpo.experiment.config import load_config

    cfg = load_config(config)
    path = os.pathsep.join([str(Path(code_root) / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="margrpo-fingerprint-") as tmp:
        work = Path(tmp)
        for argv in stage_commands(cfg, stage, policy, work):
            threads = [] if argv[0] == "make-suites" else ["--threads", "1"]
            cmd = [sys.executable, "-m", "margrpo.cli", *argv, *threads]
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
            if proc.returncode:
                raise RuntimeError(
                    f"fingerprint of {stage} ({code_root}): `margrpo {argv[0]}` failed:\n{proc.stderr[-3000:]}"
                )
        return _hash_outputs(work, stage)


def _hash_outputs(work: Path, stage: str) -> str:
    """The stage's weights (every tensor's name, dtype, shape and bytes) and its reports' numbers, timings left out."""
    from safetensors.torch import load_file

    folder = {"toyclip": work / "toyclip", "toypref": work / "toypref", "pretrain": work / "policy"}[stage]
    reports = {"toyclip": ["toyclip.json"], "toypref": ["toypref.json"], "pretrain": ["quality.json"]}[stage]
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*.safetensors")):
        for name, t in sorted(load_file(str(path)).items()):
            h.update(f"{path.relative_to(folder)}:{name}:{t.dtype}:{list(t.shape)}\0".encode())
            h.update(t.contiguous().numpy().tobytes())
    for name in reports:
        h.update(json.dumps(_numbers(json.loads((work / name).read_text())), sort_keys=True).encode())
    return h.hexdigest()


def _numbers(value):
    """A report without its timing entries (wall or CPU seconds change with the machine's load, not the code)."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items() if not any(t in k.lower() for t in _TIMING)}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def checkout(commit: str, into: Path) -> Path:
    """A detached git worktree of `commit` at `into` (the code a release was packed from); remove with `release`."""
    add = ["git", "-C", str(REPO), "worktree", "add", "--detach", str(into), commit]
    subprocess.run(add, check=True, capture_output=True)
    return into


def release(worktree: Path) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], capture_output=True)
