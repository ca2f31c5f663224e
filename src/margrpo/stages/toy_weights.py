"""`margrpo place-weights` and `margrpo pack-weights`: the toy's trained stages shipped like a release.

place-weights: the DAG's stand-in for a shared toy stage (toyclip, toypref, a base policy's pre-training) whose
folder the package ships for the same settings and code (`margrpo.infra.weights.fresh_folders`): the folder is
copied into results/ after every file's sha256 is checked against the manifest.
pack-weights: `make toy-weights` trains those stages with the pipeline (`toy_weights: train`) and then packs their
folders, with the manifest, into margrpo/data/toy_weights/, from a clean tree: the manifest names the commit
(`code_at`) whose code each digest was taken of.
refresh-release: after a change of a shipped stage's code, prove it moves no number (experiment.fingerprint: the stage
on the smoke input with the code at `code_at` and with today's, bit for bit) and record today's digest as
equivalent; a stage whose numbers moved is named, and stays stale until `make toy-weights`.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

METRICS = ("quality.json", "metrics.json")  # what a stage folder says of its model's quality


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--folder", help="place-weights: the results folder to fill (results/<stage>/<name>)")
    p.add_argument("--config", help="pack-weights: the config whose toy stages ship (its results must be there)")
    p.add_argument("--results", default="results", help="pack-weights: where the trained folders are")
    p.add_argument("--release", default=None, help="the release folder (default: margrpo/data/toy_weights)")
    p.add_argument(
        "--accept-weak-base",
        default=None,
        metavar="WHY",
        help="pack-weights: pack bases below their quality bar (evaluation.competence), recording WHY in the manifest",
    )


def run(args: argparse.Namespace) -> None:
    from margrpo.infra.weights import RELEASE, place_folder

    release = Path(args.release) if args.release else RELEASE
    if args.stage == "refresh-release":
        if not args.config:
            raise SystemExit("margrpo refresh-release: --config is required")
        stale = refresh(args.config, release)
        if stale:
            raise SystemExit(
                "stale shipped stages (their numbers moved): " + ", ".join(stale) + "; run make toy-weights"
            )
        return
    if args.stage == "place-weights":
        if not args.folder:
            raise SystemExit("margrpo place-weights: --folder is required")
        place_folder(args.folder, release)
        log.info("placed %s from the release %s", args.folder, release)
    else:
        if not args.config:
            raise SystemExit("margrpo pack-weights: --config is required")
        # the package's own release must name a commit its code digests are of; a release elsewhere is the user's
        pack(args.config, Path(args.results), release, args.accept_weak_base, require_clean=release == RELEASE)


def base_competence(config: dict, results: Path) -> dict[str, dict]:
    """{release key of a base: {"gate", "measured", "shortfalls"}}: each toy base against its bar, a Harmon-like base
    (its warm-up on) by its warm-up's quality.json, which must be there (`make toy-weights` runs the warm-ups)."""
    from margrpo.evaluation.competence import measures, shortfalls
    from margrpo.experiment.specs import shared_dirs
    from margrpo.infra.files import read_json
    from margrpo.infra.weights import release_key

    dirs, out = shared_dirs(config), {}
    for name, base in dirs["base"].items():
        if Path(base).parts[-2] != "pretrain" or name not in config["policies"]:
            continue
        gate, folder = ("warmup", dirs["warmup"][name]) if name in dirs["warmup"] else ("pretrain", base)
        path = results / release_key(folder) / "quality.json"
        if not path.is_file():
            out[release_key(base)] = {"gate": gate, "measured": None, "shortfalls": [f"{path}: not measured"]}
            continue
        quality = read_json(path)
        out[release_key(base)] = {"gate": gate, "measured": measures(quality), "shortfalls": shortfalls(quality, gate)}
    return out


def pack(
    config_file: str, results: Path, release: Path, accept_weak: str | None = None, require_clean: bool = False
) -> dict:
    """Copy the config's trained toy stages (state/ and dot files left out) into `release` with the manifest; a base
    below its quality bar is refused unless `accept_weak` says why (recorded with the shortfall), and with
    `require_clean` a checkout whose tracked files differ from its commit is refused (digests must be a commit's)."""
    from margrpo.experiment.config import load_config
    from margrpo.experiment.specs import toy_stages
    from margrpo.infra.files import InputError, atomic_write_json, read_json, sha256_file
    from margrpo.infra.weights import MANIFEST, cpu_description, read_manifest, release_key, source_digest

    commit = _commit()
    if require_clean and commit.endswith("-dirty"):
        raise InputError(
            "the checkout has uncommitted changes (git status); commit them first, so that the "
            "release's code digests are those of a commit (code_at) that refresh-release can check a change against"
        )
    config = load_config(config_file)
    stages = toy_stages(config)  # named as the DAG names them: hashes hold results/... paths
    competence = base_competence(config, results)
    weak = {key: c["shortfalls"] for key, c in competence.items() if c["shortfalls"]}
    if weak and not accept_weak:
        raise InputError(
            "bases below their quality bar (margrpo.evaluation.competence): "
            + "; ".join(f"{key}: {', '.join(why)}" for key, why in weak.items())
            + ". Train them further, or pack them anyway with --accept-weak-base 'why'"
        )
    folders = {}
    for folder, stage in stages.items():
        key = release_key(folder)
        src, dest = results / key, release / key
        files = _copy_folder(src, dest)
        metrics = {m: read_json(src / m) for m in METRICS if (src / m).is_file()}
        spec = read_json(src / "spec.json") if (src / "spec.json").is_file() else {}
        folders[key] = {
            **stage,
            "trained_at": spec.get("git_rev", "unknown"),  # the commit the stage's job ran at (its spec.json)
            "ran_on": spec.get("kernels", {}),  # its CPU, kernel caps and threads (a CUDA job's device: its spec)
            "source_digest": source_digest(stage["sources"]),
            "metrics": metrics,
            "files": {name: sha256_file(dest / name) for name in files},
        }
        if key in competence:
            folders[key]["competence"] = {**competence[key], **({"accepted_weak": accept_weak} if key in weak else {})}
    for old in set(read_manifest(release).get("folders", {})) - set(folders):
        shutil.rmtree(release / old, ignore_errors=True)
    manifest = {
        "format": 1,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "packed_at": commit,
        "code_at": commit,
        "cpu": cpu_description(),
        "torch": _torch_version(),
        "config": config_file,
        "folders": folders,
    }
    atomic_write_json(release / MANIFEST, manifest)
    size = sum(f.stat().st_size for f in release.rglob("*") if f.is_file())
    log.info("packed %d folders into %s (%.1f MB)", len(folders), release, size / 1e6)
    return manifest


def _copy_folder(src: Path, dest: Path) -> list[str]:
    """`src`'s files into a fresh `dest`, state/ and dot files left out: their names, relative to it."""
    from margrpo.infra.files import InputError

    files = sorted(
        str(f.relative_to(src))
        for f in src.rglob("*")
        if f.is_file() and not any(part.startswith(".") or part == "state" for part in f.relative_to(src).parts)
    )
    if not files:
        raise InputError(f"{src}: nothing trained here; run `make toy-weights` (it trains before it packs)")
    if dest.exists():
        shutil.rmtree(dest)
    for name in files:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / name, dest / name)
    return files


def refresh(config_file: str, release: Path) -> list[str]:
    """Record today's code digest of each shipped stage of `config_file` whose code changed since `code_at` but whose
    fingerprint did not (this machine, both codes); returns the release keys of the stages whose numbers moved."""
    import tempfile

    from margrpo.experiment.config import load_config
    from margrpo.experiment.fingerprint import checkout, fingerprint
    from margrpo.experiment.fingerprint import release as remove_worktree
    from margrpo.experiment.specs import toy_stages
    from margrpo.infra.files import InputError, atomic_write_json
    from margrpo.infra.weights import MANIFEST, read_manifest, release_key, source_digest

    manifest = read_manifest(release)
    if "code_at" not in manifest:
        raise InputError(f"{release / MANIFEST}: names no code_at commit (packed before refresh-release); repack")
    repo, stale = Path(__file__).resolve().parents[3], []
    with tempfile.TemporaryDirectory(prefix="margrpo-release-code-") as tmp:
        old_root = None
        for folder, want in toy_stages(load_config(config_file)).items():
            key = release_key(folder)
            entry = manifest["folders"].get(key)
            today = source_digest(want["sources"])
            if entry is None or today in (entry["source_digest"], *entry.get("equivalent_digests", [])):
                continue
            if old_root is None:
                old_root = checkout(manifest["code_at"], Path(tmp) / "code")
            if source_digest(want["sources"], old_root / "src" / "margrpo") != entry["source_digest"]:
                raise InputError(
                    f"{release / MANIFEST}: code_at {manifest['code_at']} is not the code {key} was packed with"
                )
            policy = Path(folder).name.rsplit("-", 1)[0] if want["stage"] == "pretrain" else None
            try:
                before, after = (fingerprint(root, want["stage"], policy) for root in (old_root, repo))
            except RuntimeError as err:  # the old code cannot run today's input (a new setting): nothing proven
                stale.append(key)
                log.info("%s: no fingerprint to compare (%s): retrain it", key, str(err).splitlines()[0])
                continue
            if before == after:
                entry.setdefault("equivalent_digests", []).append(today)
                log.info("%s: code changed, its numbers did not (fingerprint %s): still current", key, after[:12])
            else:
                stale.append(key)
                log.info("%s: its numbers moved (fingerprint %s -> %s): retrain it", key, before[:12], after[:12])
        if old_root is not None:
            remove_worktree(old_root)
    atomic_write_json(release / MANIFEST, manifest)
    return stale


def _commit() -> str:
    """The checkout's commit (`git_revision`), marked `-dirty` where its tracked files differ from it."""
    from margrpo.stages._common import git_revision

    rev = git_revision()
    if rev == "unknown":
        return rev
    status = ["git", "status", "--porcelain", "--untracked-files=no"]
    dirty = subprocess.run(status, cwd=Path(__file__).parent, capture_output=True, text=True).stdout.strip()
    return rev + ("-dirty" if dirty else "")


def _torch_version() -> str:
    import torch

    return torch.__version__
