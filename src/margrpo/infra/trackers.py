"""The experiment trackers (TensorBoard, wandb) through accelerate: checked, started once per run, resumed
without showing a step twice, closed."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

import torch

TRACKERS = ("tensorboard", "wandb")


def check_trackers(names: Iterable[str]) -> None:
    """Known tracker names, each installed: asking for wandb without it is an error, not a silent no-op."""
    for name in names:
        if name not in TRACKERS:
            raise ValueError(f"unknown tracker {name!r}; expected some of {', '.join(TRACKERS)}")
        if importlib.util.find_spec("tensorboard" if name == "tensorboard" else "wandb") is None:
            raise ValueError(f"trackers: {name!r} is asked for but not installed (pip install {name}), or drop it")


def log_image_grid(accelerator, tag: str, images: torch.Tensor, step: int) -> None:
    """Images [N, 3, H, W] in [0, 1] side by side, as one image at `step` in every tracker that takes images."""
    grid = images.detach().float().clamp(0, 1).cpu().permute(1, 2, 0, 3).flatten(2)  # [3, H, N * W]
    for tracker in accelerator.trackers:
        if tracker.name == "tensorboard":
            tracker.writer.add_image(tag, grid, global_step=step)
        elif tracker.name == "wandb":
            tracker.log_images({tag: [grid.permute(1, 2, 0).numpy()]}, step=step)


TB_EVENTS = "events.out.tfevents."  # how the name of every file TensorBoard's writer writes starts


def clear_event_files(folder: Path) -> None:
    """Remove TensorBoard's event files (`events.out.tfevents.*`) from `folder`, what its writer wrote there, and
    nothing else: a file a user put in the folder stays, and so does the folder (issue #36: a run deletes nothing
    it did not write). A linked folder is left whole: the files it leads to are not this run's to remove."""
    if folder.is_symlink() or not folder.is_dir():
        return
    for p in folder.iterdir():
        if p.name.startswith(TB_EVENTS) and p.is_file() and not p.is_symlink():
            p.unlink()


def start_trackers(accelerator, log_dir: Path, name: str, resumed_at: int | None, wandb: dict) -> None:
    """The accelerator's trackers, once per run, under a fixed run name. A fresh start removes the event files
    of earlier runs from the run's folder (`clear_event_files`: those alone, not the folder); a resume at step s
    hides what a killed run logged after s (TensorBoard's purge_step; wandb resumes the run of the same id), so
    no step shows twice. Every log then names its step."""
    if not accelerator.log_with or accelerator.trackers:
        return
    if resumed_at is None and accelerator.is_main_process:
        clear_event_files(Path(log_dir) / name)
    tensorboard = {} if resumed_at is None else {"purge_step": resumed_at + 1}
    accelerator.init_trackers(
        name, init_kwargs={"tensorboard": tensorboard, "wandb": {"resume": "allow", "dir": str(log_dir), **wandb}}
    )


def end_trackers(accelerator) -> None:
    """Close the trackers (flushing them); a later start_trackers opens them again."""
    for tracker in accelerator.trackers:
        tracker.finish()
    accelerator.trackers = []
