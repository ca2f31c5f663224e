"""What every training loop takes from the machine and the schedule: mixed precision, the
learning-rate schedule, peak memory for the logs, the EMA of the weights and the trackers."""

from __future__ import annotations

import importlib.util
import math
import resource
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import torch

PRECISIONS = ("no", "bf16", "fp16")


def autocast(device: torch.device, precision: str):
    """torch.autocast for `precision` ("no": full float32, "bf16", "fp16") on the device's type."""
    if precision == "no":
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def warmup_cosine(step: int, steps: int, warmup: int, floor: float = 0.0) -> float:
    """LR factor of step `step` of `steps`: linear warm-up over `warmup` steps, then cosine decay to `floor`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def peak_memory_mb() -> float:
    """Peak GPU memory allocated by torch, or on CPU this process's max resident set, in MiB."""
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class EMA:
    """Exponential moving average of a module's state (or of the entries `names`: what RL trains), kept
    in float32 so that a decay near 1 still moves it; evaluation and the saved policy use it.

    Named entries are read off the module's parameters and buffers, not its state_dict: LoRA's
    state-dict hook hides the adapters (policy.memory), and the adapters are what RL trains then."""

    def __init__(self, module: torch.nn.Module, decay: float, names: Iterable[str] | None = None):
        self.decay, self.names = decay, None if names is None else list(names)
        state = self._tensors(module)
        self.shadow = {k: _master(state[k]) for k in (state if names is None else self.names)}

    def _tensors(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        if self.names is None:
            return module.state_dict()
        return {**dict(module.named_buffers()), **dict(module.named_parameters())}

    def tracked(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """A copy of the module's own values of the averaged entries (the raw weights RL goes on from)."""
        state = self._tensors(module)
        return {k: state[k].detach().clone() for k in self.shadow}

    @torch.no_grad()
    def assign(self, module: torch.nn.Module, values: dict[str, torch.Tensor]) -> None:
        """Write `values` (averaged entries by name) into the module."""
        if self.names is None:
            module.load_state_dict(values)
            return
        state = self._tensors(module)
        for k, v in values.items():
            state[k].copy_(v)

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        state = self._tensors(module)
        for k, s in self.shadow.items():
            if s.dtype.is_floating_point:
                s.lerp_(state[k].detach().float(), 1 - self.decay)
            else:
                s.copy_(state[k])

    def copy_to(self, module: torch.nn.Module) -> None:
        self.assign(module, self.shadow)

    @contextmanager
    def applied(self, module: torch.nn.Module):
        """The module holds the average inside the block and its own weights again after it."""
        raw = self.tracked(module)
        self.copy_to(module)
        try:
            yield module
        finally:
            self.assign(module, raw)


def _master(v: torch.Tensor) -> torch.Tensor:
    return v.detach().float().clone() if v.dtype.is_floating_point else v.detach().clone()


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
