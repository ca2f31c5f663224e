"""A GRPO run's checkpoints. Each one is a policy folder of whole tensors (what selection and evaluation read) and
the training state, saved with torch.distributed.checkpoint: every process writes its own shards, and a load
reshards them to the processes and the sharding that read them, so a killed run resumes under any process count.
A header (state/trainer.pt: step, metrics rows, the spec's hash) names the latest; a state of another spec is never
resumed, and the states of earlier checkpoints are dropped once a later one is written."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from margrpo.grpo.run_files import checkpoint_path, clear_written_state, drop_training_states, training_state_path
from margrpo.infra.ema import EMA
from margrpo.infra.files import (
    InputError,
    checked_path,
    failure_causes,
    record_checksums,
    space_named,
    spec_hash,
    verify_checksums,
)
from margrpo.policy.lora import save_adapters

log = logging.getLogger("margrpo.grpo.trainer")
HEADER = "trainer.pt"


class Checkpointer:
    """Saves and resumes the training state of the parameters of `policy` (the trained ones and the rest), the
    optimizer's, and the EMA's, through `engine` (grpo.engine: which process writes what, the policy export)."""

    def __init__(
        self,
        policy: nn.Module,
        optimizer: torch.optim.Optimizer,
        engine,
        state_dir: Path,
        ema: EMA | None = None,
        lora: bool = False,
    ):
        self.policy, self.optimizer, self.engine, self.ema, self.lora = policy, optimizer, engine, ema, lora
        self.state_dir = Path(state_dir)

    def training_state(self) -> dict:
        """What torch.distributed.checkpoint saves and loads in place: each process's tensors (shards under FSDP),
        keyed by name, never through a state-dict hook (LoRA's adapters are parameters like any other here)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = {
            "policy": {n: t.detach() for n, t in [*self.policy.named_parameters(), *self.policy.named_buffers()]},
            # torch's optimizer state by parameter name; a fresh optimizer's is created first (a step at lr 0)
            "optimizer": get_optimizer_state_dict(self.policy, self.optimizer),
        }
        if self.ema:  # the policy above holds the raw weights RL goes on from; the folder holds their average
            state["ema"] = self.ema.shadow
        return state

    def save(self, step: int, header: dict) -> None:
        """The checkpoint of `step`: the policy folder (the EMA's weights where there is one), the training state
        beside it, then the header that names it, written last so that a save killed anywhere leaves the previous
        checkpoint resumable."""
        ckpt, engine = checkpoint_path(self.state_dir, step), self.engine

        def write(policy: nn.Module) -> None:
            with space_named(ckpt.parent):  # a full disk says so, naming the checkpoint (torch: "basic_ios::clear")
                policy.save_pretrained(ckpt)
                if self.lora:  # the base weights above are unchanged; the adapters beside them
                    save_adapters(policy, ckpt)

        with self.ema.applied(self.policy) if self.ema else contextlib.nullcontext():  # selection reads the EMA
            engine.save_policy(self.policy, write)
        target = training_state_path(self.state_dir, step)
        # one temporary folder for every process's shards, named by the main process; renamed in when complete
        tmp = None
        if engine.is_main:
            for killed in target.parent.glob(f".{target.name}.*.tmp"):  # a killed save's shards
                shutil.rmtree(killed)
            tmp = tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            os.chmod(tmp, 0o755)  # mkdtemp's folder is private
        tmp = engine.from_main(tmp)
        try:
            with space_named(target.parent), _one_process(engine):
                dcp.save(self.training_state(), checkpoint_id=tmp, no_dist=engine.world == 1)
        except BaseException as err:
            if engine.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            causes = [c for c in failure_causes(err) if c is not err]
            if causes:  # torch.distributed.checkpoint gathers each process's error into a BaseException of its own
                raise causes[0] from err
            raise
        if engine.is_main:
            record_checksums(tmp, sorted(p.name for p in Path(tmp).iterdir()))  # every shard and .metadata
            shutil.rmtree(target, ignore_errors=True)  # a checkpoint saved again (a resumed run's)
            Path(tmp).rename(target)
            with checked_path(self.state_dir / HEADER) as path:
                torch.save({**header, "step": step, "format": 2}, path)
            drop_training_states(self.state_dir, keep=step)
        # no process goes on before the checkpoint is on disk: one that dies in the next step cannot take it along
        engine.barrier()

    def resume(self, run_hash: str) -> dict | None:
        """The header of the checkpoint to resume from, its state loaded into the policy, optimizer and EMA; None
        when state/ holds none, or one of another spec (`run_hash`: then state/ is cleared of what saves wrote)."""
        engine, path = self.engine, self.state_dir / HEADER
        whole, why = _read_header(path, run_hash) if engine.is_main else ({}, "")
        header = engine.from_main(
            {k: v for k, v in whole.items() if k not in ("optimizer", "raw", "ema")} | {"why": why}
        )
        if not header["why"] and not header.get("spec_hash"):  # nothing written yet
            return None
        if header.get("spec_hash") != run_hash:
            log.info("not resuming from %s: %s; starting fresh", path, header["why"])
            if engine.is_main:
                clear_written_state(self.state_dir)
            engine.barrier()
            return None
        if header.get("format", 1) < 2:  # a checkpoint of before torch.distributed.checkpoint (trainer.pt whole)
            self._resume_whole(header["step"], whole)
        else:
            self._load(training_state_path(self.state_dir, header["step"]))
        log.info("resumed from %s at step %d", path, header["step"])
        return header

    def _load(self, folder: Path) -> None:
        """The training state of `folder`, checked against its manifest, into this process's tensors."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        problem = ""
        if self.engine.is_main:
            try:
                verify_checksums(folder)
            except InputError as err:
                problem = str(err)
        problem = self.engine.from_main(problem)
        if problem:
            raise InputError(
                f"{problem}\nThe training state in {folder} cannot be resumed; move state/ aside to start the run "
                "afresh (its checkpoints' policy folders stay usable)"
            )
        # the optimizer's state is created (a step at lr 0, which the EMA's hook sees) before anything is read into it
        state = self.training_state()
        with _one_process(self.engine):
            dcp.load(state, checkpoint_id=folder, no_dist=self.engine.world == 1)
        set_optimizer_state_dict(self.policy, self.optimizer, state["optimizer"])

    def _resume_whole(self, step: int, state: dict) -> None:
        """A checkpoint written before issue 52: whole tensors (the policy folder; the optimizer, the raw weights and
        the EMA in trainer.pt, `state`), read by the main process; the engine hands each process its share."""
        engine = self.engine
        # the optimizer after the weights: torch's loader may take an empty step to create the state, which the
        # EMA's hook would see
        folder = checkpoint_path(self.state_dir, step)
        engine.load_policy_state(self.policy, _checkpoint_policy(folder) if engine.is_main else None)
        engine.load_optimizer_state(self.optimizer, self.policy, state.get("optimizer"))
        if self.ema:  # the folder holds the EMA of the trained parameters; RL goes on from the raw ones
            like = self.ema.tracked(self.policy)
            self.ema.assign(self.policy, engine.shard_like(engine.from_main(state.get("raw")), like))
            shadow = engine.shard_like(engine.from_main(state.get("ema")), like)
            self.ema.shadow = {k: v.float() for k, v in shadow.items()}


@contextlib.contextmanager
def _one_process(engine):
    """torch.distributed.checkpoint on one process (no process group): as meant, so without its warning."""
    with warnings.catch_warnings():
        if engine.world == 1:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _read_header(path: Path, run_hash: str) -> tuple[dict, str]:
    """trainer.pt, checked, and why it cannot be resumed from ("" when it can, or when there is none)."""
    if not path.exists():
        return {}, ""
    try:
        verify_checksums(path.parent, [path.name])
        header = torch.load(path, map_location="cpu", weights_only=True)
    except InputError as err:  # changed or damaged since it was written
        return {}, str(err)
    except Exception as err:  # an older or foreign state file: it cannot be trusted either
        return {}, f"it cannot be read with weights_only=True ({type(err).__name__})"
    if header.get("spec_hash") != run_hash:
        return header, f"it holds a run of another spec ({header.get('spec_hash')}; this run: {run_hash})"
    return header, ""


def _checkpoint_policy(ckpt: Path) -> torch.nn.Module:
    """The policy of a checkpoint folder, whole, with its LoRA adapters, on the CPU."""
    from margrpo.policy import load_policy  # the policy registry imports every model family

    return load_policy(ckpt)


def resume_key(settings: dict, sampling: dict, spec: dict | None) -> str:
    """The hash a resumable state must match: the trainer's settings (GRPO and policy, flat) and sampling, plus
    the stage's `spec` (inputs, reward, seed). The trackers, the gradient-variance probe and the sharding do not
    count (the sharding changes no result but its summation order: a run resumes under another), and
    neither do switches that are off (EMA, LoRA, checkpointing, replay_chunk), so that states written before those
    switches existed still resume."""
    off = {"ema_decay": None, "lora": None, "gradient_checkpointing": False, "replay_chunk": None}

    def quiet(g: dict) -> dict:
        ignored = ("trackers", "sharding", "grad_variance")
        return {k: v for k, v in g.items() if k not in ignored and not (k in off and v == off[k])}

    if spec and "grpo" in spec:  # the policy's settings count as they did inside the grpo section
        grpo = quiet({**spec["grpo"], **spec.get("policy", {})})
        spec = {**{k: v for k, v in spec.items() if k != "policy"}, "grpo": grpo}
    return spec_hash({"grpo": quiet(settings), "sampling": sampling, "spec": spec})
