"""A training run's folder, as every RL run writes it (the GRPO trainer and the related methods alike): the loop's
state (`RunState`), where checkpoints go, metrics.csv and summary.json (`write_run_outputs`: select, evaluate and
report read them), and how a resumed run clears what an earlier save wrote in state/ and nothing else."""

from __future__ import annotations

import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from margrpo.infra.files import CHECKSUMS, atomic_write_json, atomic_write_rows, listed_files, non_finite
from margrpo.infra.runtime import peak_memory_mb
from margrpo.infra.trackers import TB_EVENTS

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """What the loop has done: steps run, their metrics rows, and the validations (step 0 first)."""

    step: int = 0
    rows: list[dict] = field(default_factory=list)
    checkpoints: list[dict] = field(default_factory=list)  # {step, val_reward, val_scores, path (None at step 0)}


def step_row(step: int, rewards, components: dict, adv, frac_zero: float, updates: dict, lr: float, seconds: float):
    """A step's row of metrics.csv, in the columns and order every group-advantage method writes (GRPO, MaskGRPO):
    the batch's rewards and each term's mean, its advantages, the method's update columns, the learning rate, the
    step's time and the process's peak memory."""
    return {
        "step": step,
        "reward_mean": rewards.mean().item(),
        "reward_std": rewards.std().item(),
        **{f"reward/{k}": v.mean().item() for k, v in components.items()},
        "adv_mean": adv.mean().item(),
        "adv_std": adv.std().item(),
        "frac_zero_std": frac_zero,
        **updates,
        "lr": lr,
        "step_time_s": seconds,
        "peak_mem_mb": peak_memory_mb(),
    }


def checkpoint_path(state_dir: str | Path, step: int) -> Path:
    """Where the policy of a checkpoint goes, as the GRPO trainer's: state/ckpt-XXXXXX/policy."""
    return Path(state_dir) / f"ckpt-{step:06d}" / "policy"


def training_state_path(state_dir: str | Path, step: int) -> Path:
    """Where a checkpoint's training state goes (torch.distributed.checkpoint's shards): state/ckpt-XXXXXX/train."""
    return Path(state_dir) / f"ckpt-{step:06d}" / "train"


def drop_training_states(state_dir: str | Path, keep: int) -> None:
    """The training states of every checkpoint but step `keep`'s (each would resume an older step): what their
    manifests list, as clear_written_state removes it. Their policy folders stay for selection."""
    for folder in Path(state_dir).glob("ckpt-*/train"):
        if CHECKPOINT.fullmatch(folder.parent.name) and folder != training_state_path(state_dir, keep):
            if folder.is_dir() and not folder.is_symlink():
                _remove_listed(folder)


TRAINER_FILES = ("trainer.pt", CHECKSUMS)  # what a trainer's save writes at the top of state/, beside its ckpt-<step>/
CHECKPOINT = re.compile(r"ckpt-\d{6}")  # `checkpoint_path`'s folder of one checkpoint
POLICY = ("policy", ".policy.old")  # the policy folder in it, and where atomic_dir moves the old one aside
TRAIN = "train"  # the training state beside it (torch.distributed.checkpoint), with its manifest
FROZEN_LINKS = (
    "vae",
    "text_encoder",
    "tokenizer",
)  # NOVA's links to its frozen parts (policy/nova.py save_pretrained)
_TEMPORARY = re.compile(r"\.(.+)\.[a-z0-9_]+\.tmp(\.[^.]*)?")  # atomic_path / atomic_dir: .<name>.<random>.tmp<suffix>


def temporary_of(name: str) -> str | None:
    """The file or folder an atomic writer was writing when it left the temporary `name` behind, else None."""
    m = _TEMPORARY.fullmatch(name)
    return m[1] if m and (m[2] or "") == Path(m[1]).suffix else None


def clear_written_state(state_dir: str | Path) -> None:
    """Remove from state/ what a trainer's save wrote there, and nothing else: a run deletes nothing it did not
    write (issues #31.5, #36). A trainer (this loop's `save_fn`, `margrpo train`'s GRPOTrainer.save) writes

    - trainer.pt and checksums.json at the top of state/: these two names, files (not folders or links);
    - the atomic writers' temporary files of those two (.trainer.pt.<random>.tmp.pt, killed writes);
    - ckpt-<6 digits>/policy/: of it, only what its own checksums.json (the manifest every policy folder margrpo
      writes carries) lists, the manifest itself, the temporary files of those, and NOVA's links to its frozen
      parts; atomic_dir's .policy.<random>.tmp/ and .policy.old/ beside it (the former whole: a killed write's);
    - ckpt-<6 digits>/train/ (the training state's shards) as policy/, and its .train.<random>.tmp/ whole;
    - then the folders these removals left empty (policy/, its subfolders, ckpt-<step>/), no other folder.

    So a user's file anywhere in state/ stays, beside a checkpoint or inside its policy folder too (unless
    it was there before the trainer wrote that folder: the manifest then lists it with the checkpoint's files),
    and so does its folder; a folder with a checkpoint's name that holds no margrpo manifest (a stray
    ckpt-000005/ a user made, or one a killed save left before its manifest) stays whole. A copy of a margrpo
    checkpoint put there under a checkpoint's name carries the manifest, and is taken as the trainer's."""
    state_dir = Path(state_dir)
    for p in state_dir.iterdir():
        if p.name in TRAINER_FILES or temporary_of(p.name) in TRAINER_FILES:
            if p.is_file() and not p.is_symlink():
                p.unlink()
                continue
        elif CHECKPOINT.fullmatch(p.name) and p.is_dir() and not p.is_symlink():
            _clear_checkpoint(p)
            if p.exists():
                log.info("keeping %s: it holds files this trainer did not write", p)
            continue
        log.info("keeping %s: not written by this trainer", p)


def remove_killed_writes(state_dir: str | Path) -> None:
    """The temporary files a killed write of trainer.pt or its manifest left at the top of state/ (never a file
    those writers did not name): called under the run folder's lock, so no live writer owns them."""
    state_dir = Path(state_dir)
    if not state_dir.is_dir():
        return
    for p in state_dir.iterdir():
        if temporary_of(p.name) in TRAINER_FILES and p.is_file() and not p.is_symlink():
            p.unlink()


def set_aside(state_dir: str | Path, stamp: str) -> Path:
    """Move what a trainer wrote in state/ (the header, its manifest, each ckpt-<step>/ folder that holds a saved
    policy or training state) and the run's TensorBoard event files to <run>/aside-<stamp>/: a run that starts
    afresh over one it cannot resume deletes nothing (issue 59). A user's other files stay where they are."""
    state_dir = Path(state_dir)
    aside = state_dir.parent / f"aside-{stamp}"
    (aside / state_dir.name).mkdir(parents=True)
    for p in state_dir.iterdir():
        saved = CHECKPOINT.fullmatch(p.name) and any(listed_files(p / part) is not None for part in (*POLICY, TRAIN))
        if (p.name in TRAINER_FILES or saved) and not p.is_symlink():
            p.rename(aside / state_dir.name / p.name)
    for events in (state_dir.parent / "tb").glob(f"*/{TB_EVENTS}*"):  # the old run's curves, beside it
        if events.is_file() and not events.is_symlink() and not events.parent.is_symlink():
            (aside / "tb" / events.parent.name).mkdir(parents=True, exist_ok=True)
            events.rename(aside / "tb" / events.parent.name / events.name)
    return aside


def _clear_checkpoint(folder: Path) -> None:
    """What a save wrote in one ckpt-<step>/ folder (see clear_written_state); the folder too if that was all."""
    for p in folder.iterdir():
        if p.is_symlink() or not p.is_dir():
            continue
        if p.name in POLICY or p.name == TRAIN:
            _remove_listed(p)
        elif temporary_of(p.name) in ("policy", TRAIN):  # the temporary folder of a killed save
            shutil.rmtree(p)
    _prune([folder], folder)


def _remove_listed(folder: Path) -> None:
    """The files `folder`'s checksums.json lists, the manifest, the temporary files of those and NOVA's frozen
    links; then the folders left empty. A folder without a readable manifest is left whole."""
    listed = listed_files(folder)
    if listed is None:
        log.info("keeping %s: no %s of margrpo's in it", folder, CHECKSUMS)
        return
    listed = set(listed) | {CHECKSUMS}
    removed = []
    for root, dirs, files in os.walk(folder):  # never through a link
        here = Path(root)
        for name in files:
            p, target = here / name, temporary_of(name)
            if not p.is_symlink() and (
                p.relative_to(folder).as_posix() in listed
                or (target is not None and (here / target).relative_to(folder).as_posix() in listed)
            ):
                p.unlink()
                removed.append(here)
        for name in [d for d in dirs if (here / d).is_symlink()]:
            dirs.remove(name)
            if here == folder and name in FROZEN_LINKS:
                (here / name).unlink()  # the link, never what it leads to
                removed.append(here)
    _prune(removed, folder)


def _prune(folders: list[Path], top: Path) -> None:
    """Remove each of `folders` that is empty now, then its parents while they are empty, up to `top` included."""
    for d in sorted(set(folders), key=lambda d: len(d.parts), reverse=True):
        while (d == top or top in d.parents) and d.is_dir() and not d.is_symlink() and not any(d.iterdir()):
            d.rmdir()
            d = d.parent


def write_run_outputs(out_dir: str | Path, state: RunState, variant: str, spec: dict, config: dict) -> dict:
    """metrics.csv (one row per step) and summary.json, atomically; returns the summary. Every RL run writes
    these two files, in this format (the GRPO trainer too): select, evaluate and report read them."""
    out = Path(out_dir)
    atomic_write_rows(out / "metrics.csv", state.rows)
    base = next((c for c in state.checkpoints if c["step"] == 0), {"val_reward": float("nan"), "val_scores": None})
    summary = {
        "run_dir": str(out),
        "variant": variant,
        "steps": state.step,
        "checkpoints": [c for c in state.checkpoints if c["step"] > 0],
        "base_val_reward": base["val_reward"],
        "base_val_scores": base["val_scores"],
        "spec": spec,
        "config": config,
    }
    bad = non_finite(summary)  # strict JSON: null in their place, and why
    atomic_write_json(out / "summary.json", {**summary, **({"non_finite": bad} if bad else {})}, indent=1)
    return summary
