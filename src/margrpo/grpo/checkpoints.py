"""A GRPO run's checkpoints. Each one is a policy folder of whole tensors (what selection and evaluation read) and
the training state, saved with torch.distributed.checkpoint: every process writes its own shards, and a load
reshards them to the processes and the sharding that read them, so a killed run resumes under any process count.
A header (state/trainer.pt: step, metrics rows, the run's settings) names the latest, and a copy of it travels in
each checkpoint's training state, so a damaged header falls back to the newest checkpoint that verifies. A state
is resumed only under settings that give the same steps and whose training state verifies; one it cannot resume is
never deleted (issue 59): the run stops naming what differs, or, asked to restart, moves it aside.

One checkpointer serves every RL run: the GRPO trainer and the related methods (related/), each saying what its
training state is: the policy, its optimizer, and any further modules, optimizers and random generators (`Part`);
how its policy folder is written and, for a state of before torch.distributed.checkpoint, read."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from margrpo.grpo.run_files import (
    CHECKPOINT,
    checkpoint_path,
    drop_training_states,
    remove_killed_writes,
    set_aside,
    training_state_path,
)
from margrpo.infra.ema import EMA
from margrpo.infra.files import (
    CHECKSUMS,
    InputError,
    atomic_dir,
    checked_path,
    content_id,
    failure_causes,
    listed_files,
    record_checksums,
    space_named,
    spec_hash,
    verify_checksums,
)
from margrpo.policy.lora import save_adapters

log = logging.getLogger("margrpo.grpo.trainer")
HEADER = "trainer.pt"
HEADER_COPY = "header.pt"  # the header as it was when a checkpoint was written, in its training state's folder
# settings that only extend a run: no step's numbers depend on them, so a state resumes under new values; a GRPO
# run's are in its `grpo` section, a related method's (margrpo train-related) in its `related` section
EXTENDING = ("steps", "val_every", "save_every")
SECTIONS = ("grpo", "related")
# torch.distributed.checkpoint on one process (no process group, no_dist) warns that it assumes one process, on
# each save and load: as meant. Filtered once here rather than around each call, because a save written behind the
# steps warns from its own thread after the call has returned; with several processes it never warns.
warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


@dataclass
class _Pending:
    """A save written behind the steps: its future, when it began, the header to write once it is complete, its
    folders."""

    written: object  # concurrent.futures.Future
    started: float
    header: dict
    tmp: str
    target: Path
    done_at: float | None = None


@dataclass
class Part:
    """More of a method's training state beside its policy and optimizer, saved and loaded in place: a trained
    module (its parameters and buffers), the optimizer over it, and random generators whose draws go on."""

    module: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    generators: dict[str, torch.Generator] | None = None


def write_policy_folder(policy: nn.Module, folder: Path, lora: bool = False) -> None:
    """A GRPO checkpoint's policy folder: the policy's own save_pretrained, the LoRA adapters beside it."""
    policy.save_pretrained(folder)
    if lora:  # the base weights above are unchanged; the adapters beside them
        save_adapters(policy, folder)


def replace_policy_folder(policy: nn.Module, folder: Path) -> None:
    """A related method's checkpoint's policy folder, replaced whole (atomic_dir). A folder already there that
    margrpo did not write (no checksums.json: atomic_dir only ever renames a finished folder in) is refused, not
    replaced: a run deletes nothing it did not write."""
    if (folder.exists() or folder.is_symlink()) and (folder.is_symlink() or listed_files(folder) is None):
        raise InputError(
            f"{folder}: not a checkpoint margrpo wrote (no {CHECKSUMS} in it), where this run writes a checkpoint; "
            "the run deletes nothing it did not write: move the folder away and rerun"
        )
    with atomic_dir(folder) as tmp:
        policy.save_pretrained(tmp)


class Checkpointer:
    """Saves and resumes the training state of the parameters of `policy` (the trained ones and the rest), the
    optimizer's, the EMA's and each of `parts`, through `engine` (grpo.engine: which process writes what, the
    policy export). `write_policy(policy, folder)` writes a checkpoint's policy folder; `read_policy(folder)` reads
    one back whole (a state of before torch.distributed.checkpoint); `on_accept`, where set, runs on the main process
    once state/ is accepted (to resume, or afresh) and before anything is loaded: a stage writes its spec.json there,
    so a refused run leaves it as it was."""

    def __init__(
        self,
        policy: nn.Module,
        optimizer: torch.optim.Optimizer,
        engine,
        state_dir: Path,
        ema: EMA | None = None,
        lora: bool = False,
        parts: dict[str, Part] | None = None,
        write_policy: Callable[[nn.Module, Path], None] | None = None,
        read_policy: Callable[[Path], nn.Module] | None = None,
    ):
        self.policy, self.optimizer, self.engine, self.ema, self.lora = policy, optimizer, engine, ema, lora
        self.state_dir = Path(state_dir)
        self.parts = parts or {}
        self.write_policy = write_policy or (lambda policy, folder: write_policy_folder(policy, folder, lora))
        self.read_policy = read_policy or _checkpoint_policy
        self.on_accept: Callable[[], None] | None = None
        self.pending: _Pending | None = None  # the save written behind the steps
        self.longest_s, self._group = 0.0, None

    def training_state(self) -> dict:
        """What torch.distributed.checkpoint saves and loads in place: each process's tensors (shards under FSDP),
        keyed by name, never through a state-dict hook (LoRA's adapters are parameters like any other here)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        state = {
            "policy": _tensors(self.policy),
            # torch's optimizer state by parameter name; a fresh optimizer's is created first (a step at lr 0)
            "optimizer": get_optimizer_state_dict(self.policy, self.optimizer),
        }
        if self.ema:  # the policy above holds the raw weights RL goes on from; the folder holds their average
            state["ema"] = self.ema.shadow
        for name, part in self.parts.items():
            if part.module is not None:
                state[name] = _tensors(part.module)
            if part.optimizer is not None:
                state[f"{name}.optimizer"] = get_optimizer_state_dict(part.module, part.optimizer)
            for key, generator in (part.generators or {}).items():
                state[f"{name}.{key}"] = generator.get_state()
        return state

    def save(self, step: int, header: dict, background: bool = False) -> float:
        """The checkpoint of `step`: the policy folder (the EMA's weights where there is one), the training state
        beside it, then the header that names it, written last so that a save killed anywhere leaves the previous
        checkpoint resumable. `background`: the training state is copied to CPU memory here and written behind the
        next steps (torch.distributed.checkpoint.async_save), its header once it is complete (`finish`, which the
        run loop calls before each step and the next save calls first); until then a killed run resumes from the
        checkpoint before it. Returns the longest time a save took so far, written in full (what a stop's
        save must be given)."""
        self.finish()  # one save in flight: the headers follow the steps' order
        started, ckpt, engine = time.monotonic(), checkpoint_path(self.state_dir, step), self.engine

        def write(policy: nn.Module) -> None:
            with space_named(ckpt.parent):  # a full disk says so, naming the checkpoint (torch: "basic_ios::clear")
                self.write_policy(policy, ckpt)

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
        header = {**copy.deepcopy(header), "step": step, "format": 2}  # the rows as they are now, not as they grow
        try:
            with space_named(target.parent):
                if background:
                    group = self._background_group()
                    written = dcp.async_save(
                        self.training_state(), checkpoint_id=tmp, no_dist=engine.world == 1, process_group=group
                    )
                else:
                    dcp.save(self.training_state(), checkpoint_id=tmp, no_dist=engine.world == 1)
        except BaseException as err:
            self._discard(tmp, err)
        if background:
            self.pending = pending = _Pending(written, started, header, tmp, target)
            written.add_done_callback(lambda _: setattr(pending, "done_at", time.monotonic()))
        else:
            self._complete(header, tmp, target, time.monotonic() - started)
        return self.longest_s

    def finish(self, wait: bool = True) -> None:
        """Every process together: the save written behind the steps (if any) completed, its header written, once
        its writing is over on every process (one all-reduce where there are several), or at once with `wait`; or
        its error raised, the previous checkpoint left as it was."""
        pending = self.pending
        if pending is None or (not wait and self.engine.any_process(not pending.written.done())):
            return
        self.pending = None
        try:
            with space_named(pending.target.parent):
                pending.written.result()
        except BaseException as err:
            self._discard(pending.tmp, err)
        seconds = (pending.done_at or time.monotonic()) - pending.started
        self._complete(pending.header, pending.tmp, pending.target, seconds)

    def _background_group(self):
        """The process group a background save agrees through: gloo of its own (the steps' collectives, NCCL's
        among them, go on beside it), made once by every process together; None on one process."""
        if self.engine.world == 1:
            return None
        if self._group is None:
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")
        return self._group

    def _discard(self, tmp: str, err: BaseException) -> None:
        if self.engine.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        causes = [c for c in failure_causes(err) if c is not err]
        if causes:  # torch.distributed.checkpoint gathers each process's error into a BaseException of its own
            raise causes[0] from err
        raise err

    def _complete(self, header: dict, tmp: str, target: Path, seconds: float) -> None:
        """The training state's folder renamed in, then the header that names it; older states dropped."""
        step, engine = header["step"], self.engine
        if engine.is_main:
            torch.save(header, Path(tmp) / HEADER_COPY)  # what a damaged trainer.pt is rebuilt from
            record_checksums(tmp, sorted(p.name for p in Path(tmp).iterdir()))  # every shard, .metadata, the copy
            shutil.rmtree(target, ignore_errors=True)  # a checkpoint saved again (a resumed run's)
            Path(tmp).rename(target)
            with checked_path(self.state_dir / HEADER) as path:
                torch.save(header, path)
            drop_training_states(self.state_dir, keep=step)
        self.longest_s = max(self.longest_s, seconds)
        # no process goes on before the checkpoint is on disk: one that dies in the next step cannot take it along
        engine.barrier()

    def resume(self, record: dict, legacy_hash: str, restart: bool = False) -> dict | None:
        """The header of the checkpoint to resume from, its state loaded into the policy, optimizer, EMA and parts;
        None when state/ holds no run. `record` (`resume_record`) is this run's settings: a state written under
        others that change the steps, or one that cannot be read or whose training state does not verify, stops the
        run with an InputError naming what differs, unless `restart` (then it is moved aside and the run starts
        afresh). `legacy_hash`: a header written before the settings were recorded one by one is resumed when its
        hash is this run's old-style key."""
        engine = self.engine
        decision = decide_resume(self.state_dir, record, legacy_hash, restart) if engine.is_main else None
        decision = engine.from_main(decision)
        engine.barrier()
        if decision["refuse"]:
            raise InputError(decision["refuse"])
        if engine.is_main and self.on_accept is not None:
            self.on_accept()
        header = decision["header"]
        if header is None:
            return None
        if decision.get("whole"):  # a checkpoint of before torch.distributed.checkpoint (trainer.pt whole)
            whole = (
                torch.load(self.state_dir / HEADER, map_location="cpu", weights_only=True) if engine.is_main else {}
            )
            self._resume_whole(header["step"], whole)
            if record.get("grpo.kl") == "paper":  # rows logged before the KL term had its name
                header["rows"] = [{("kl_paper" if k == "kl" else k): v for k, v in r.items()} for r in header["rows"]]
        else:
            self._load(training_state_path(self.state_dir, header["step"]))
        log.info("resumed from %s at step %d", decision["source"], header["step"])
        return header

    def _load(self, folder: Path) -> None:
        """The training state of `folder` (verified by `decide_resume`) into this process's tensors."""
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        # the optimizer's state is created (a step at lr 0, which the EMA's hook sees) before anything is read into it
        state = self.training_state()
        dcp.load(state, checkpoint_id=folder, no_dist=self.engine.world == 1)
        set_optimizer_state_dict(self.policy, self.optimizer, state["optimizer"])
        for name, part in self.parts.items():
            if part.optimizer is not None:
                set_optimizer_state_dict(part.module, part.optimizer, state[f"{name}.optimizer"])
            for key, generator in (part.generators or {}).items():
                generator.set_state(state[f"{name}.{key}"])

    def _resume_whole(self, step: int, state: dict) -> None:
        """A checkpoint written before issue 52: whole tensors (the policy folder; the optimizer, the raw weights and
        the EMA in trainer.pt, `state`), read by the main process; the engine hands each process its share."""
        engine = self.engine
        # the optimizer after the weights: torch's loader may take an empty step to create the state, which the
        # EMA's hook would see
        folder = checkpoint_path(self.state_dir, step)
        engine.load_policy_state(self.policy, self.read_policy(folder) if engine.is_main else None)
        engine.load_optimizer_state(self.optimizer, self.policy, state.get("optimizer"))
        if self.ema:  # the folder holds the EMA of the trained parameters; RL goes on from the raw ones
            like = self.ema.tracked(self.policy)
            self.ema.assign(self.policy, engine.shard_like(engine.from_main(state.get("raw")), like))
            shadow = engine.shard_like(engine.from_main(state.get("ema")), like)
            self.ema.shadow = {k: v.float() for k, v in shadow.items()}


def _tensors(module: nn.Module) -> dict:
    return {n: t.detach() for n, t in [*module.named_parameters(), *module.named_buffers()]}


def decide_resume(state_dir: Path, record: dict, legacy_hash: str, restart: bool) -> dict:
    """The main process's reading of state/: the header to resume from (None: start afresh), where it came from and
    whether its state is whole in trainer.pt (before torch.distributed.checkpoint), or why the run must stop
    ("refuse"). Only a killed header write's temporary files are deleted here; a state set aside on `restart` is
    moved whole."""
    remove_killed_writes(state_dir)
    header, why = _read_header(state_dir / HEADER)
    source, verified = state_dir / HEADER, False
    if not header:  # missing or damaged: never read as "no run" while a checkpoint's training state is there
        header, source, problems = _newest_intact(state_dir)
        verified = True
        if header:
            log.warning(
                "%s %s; resuming from %s, the newest checkpoint whose training state verifies",
                state_dir / HEADER,
                why or "is missing",
                source,
            )
        elif why or problems:
            found = "; ".join(([f"{state_dir / HEADER}: {why}"] if why else []) + problems)
            return _stop_or_set_aside(state_dir, restart, f"{state_dir} holds a run that cannot be resumed ({found})")
        else:
            saved = _saved_policies(state_dir)
            if saved:  # checkpoints of a run whose header is gone: a run it cannot prove stale
                return _stop_or_set_aside(
                    state_dir,
                    restart,
                    f"{state_dir} holds checkpoints ({saved[0].parent.name}, ...) but no {HEADER} to resume them from",
                    MOVE_ASIDE,
                )
            return {"header": None, "source": None, "refuse": ""}
    differ = _differences(header, record, legacy_hash)
    changed = [d for d in differ if not _extends(d[0])]
    if changed:
        named = "; ".join(f"{k}: {_shown(old)} there, {_shown(new)} now" for k, old, new in changed[:6])
        more = f" (and {len(changed) - 6} more)" if len(changed) > 6 else ""
        return _stop_or_set_aside(state_dir, restart, f"{state_dir} holds a run of other settings: {named}{more}")
    for key in (f"{section}.steps" for section in SECTIONS):
        steps = record.get(key)
        if isinstance(steps, int) and header.get("step", 0) > steps:  # fewer steps cannot be had from it
            return _stop_or_set_aside(
                state_dir, restart, f"{state_dir} holds a run at step {header['step']}, past this run's {key} {steps}"
            )
    # whole in trainer.pt: a GRPO state of before issue 52 (format 1), a related method's of before issue 69
    whole = header.get("format", 1) < 2 or "optimizer" in header
    if not whole and not verified:  # the header reads: its training state must too, or --restart cannot help
        folder = training_state_path(state_dir, header["step"])
        try:
            _verify_whole(folder)
        except InputError as err:
            return _stop_or_set_aside(
                state_dir, restart, f"{err}: the training state in {folder} cannot be resumed", MOVE_ASIDE
            )
    if differ:
        log.info("resuming with %s: these extend the run, no step's numbers depend on them", _listed(differ))
    light = {k: v for k, v in header.items() if k not in ("optimizer", "raw", "ema")}
    return {"header": light, "source": str(source), "refuse": "", "whole": whole}


# what a refusal suggests: the settings that wrote the state, or a fresh start
OTHER_SETTINGS = "To go on with that run, run again with its settings; to start this one afresh, pass --restart"
MOVE_ASIDE = "Its checkpoints' policy folders stay usable; to start this run afresh, pass --restart"


def _stop_or_set_aside(state_dir: Path, restart: bool, found: str, remedy: str = OTHER_SETTINGS) -> dict:
    if restart:
        aside = set_aside(state_dir, time.strftime("%Y%m%d-%H%M%S"))
        log.warning("%s; --restart: moved it to %s and starting afresh", found, aside)
        return {"header": None, "source": None, "refuse": ""}
    return {
        "header": None,
        "source": None,
        "refuse": f"{found}. Nothing was deleted. {remedy} (the old state moves to {state_dir.parent}/aside-<time>/)",
    }


def _saved_policies(state_dir: Path) -> list[Path]:
    """The policy folders margrpo wrote in state/ (each with its manifest)."""
    return sorted(
        p
        for p in state_dir.glob("ckpt-*/policy")
        if CHECKPOINT.fullmatch(p.parent.name) and not p.is_symlink() and listed_files(p) is not None
    )


def _read_header(path: Path) -> tuple[dict, str]:
    """trainer.pt, checked, and why it cannot be read ("" when it can, or when there is none)."""
    if not path.exists():
        return {}, ""
    try:
        verify_checksums(path.parent, [path.name])
        return torch.load(path, map_location="cpu", weights_only=True), ""
    except InputError as err:  # changed or damaged since it was written
        return {}, str(err)
    except Exception as err:  # an older or foreign state file: it cannot be trusted either
        return {}, f"it cannot be read with weights_only=True ({type(err).__name__})"


def _newest_intact(state_dir: Path) -> tuple[dict, Path | None, list[str]]:
    """The header copy of the newest checkpoint whose training state verifies, that folder, and what was wrong
    with the newer ones."""
    problems = []
    for folder in sorted(state_dir.glob("ckpt-*/train"), reverse=True):
        if not CHECKPOINT.fullmatch(folder.parent.name) or not folder.is_dir():
            continue
        try:
            _verify_whole(folder)
            header = torch.load(folder / HEADER_COPY, map_location="cpu", weights_only=True)
        except InputError as err:
            problems.append(str(err))
            continue
        except Exception as err:
            problems.append(f"{folder / HEADER_COPY}: cannot be read ({type(err).__name__})")
            continue
        return header, folder, problems
    return {}, None, problems


def _verify_whole(folder: Path) -> None:
    """`verify_checksums`, and every file the manifest lists is there (a deleted shard is named, not torch's)."""
    verify_checksums(folder)
    missing = [n for n in listed_files(folder) or [] if not (folder / n).is_file()]
    if missing:
        raise InputError(f"{folder / missing[0]}: listed in {folder / CHECKSUMS} but missing")


def _differences(header: dict, record: dict, legacy_hash: str) -> list[tuple[str, object, object]]:
    """(setting, its value in the state, this run's) for each setting that differs."""
    if "record" not in header:  # written before the settings were recorded one by one (issue 59)
        old = header.get("spec_hash")
        return [] if old == legacy_hash else [("the settings' hash (an older state)", old, legacy_hash)]
    old, unset = header["record"], "(unset)"
    keys = sorted(old.keys() | record.keys())
    return [(k, old.get(k, unset), record.get(k, unset)) for k in keys if old.get(k, unset) != record.get(k, unset)]


def _extends(key: str) -> bool:
    parts = key.split(".")
    return len(parts) >= 2 and parts[-1] in EXTENDING and parts[-2] in SECTIONS


def _shown(value) -> str:
    return json.dumps(value) if not isinstance(value, str) or value == "(unset)" else repr(value)


def _listed(differ) -> str:
    return ", ".join(f"{k} {_shown(old)} -> {_shown(new)}" for k, old, new in differ)


def _checkpoint_policy(ckpt: Path) -> torch.nn.Module:
    """The policy of a checkpoint folder, whole, with its LoRA adapters, on the CPU."""
    from margrpo.policy import load_policy  # the policy registry imports every model family

    return load_policy(ckpt)


def _quiet(settings: dict) -> dict:
    """The trainer's settings less what changes no number: the trackers, the gradient-variance probe and the
    sharding (it changes the summation order only: a run resumes under another), and switches that are off (EMA,
    LoRA, checkpointing, replay_chunk), so that states written before those switches existed still resume."""
    off = {"ema_decay": None, "lora": None, "gradient_checkpointing": False, "replay_chunk": None}
    ignored = ("trackers", "sharding", "grad_variance")
    return {k: v for k, v in settings.items() if k not in ignored and not (k in off and v == off[k])}


def _with_policy(spec: dict | None) -> dict | None:
    if spec and "grpo" in spec:  # the policy's settings count as they did inside the grpo section
        grpo = _quiet({**spec["grpo"], **spec.get("policy", {})})
        spec = {**{k: v for k, v in spec.items() if k != "policy"}, "grpo": grpo}
    return spec


def resume_record(settings: dict, sampling: dict, spec: dict | None) -> dict:
    """What a resumable state must match, one entry per setting (dotted keys, so that a refusal names it): the
    trainer's settings (GRPO and policy, flat) and sampling, plus the stage's `spec` (reward, seed, inputs), the
    inputs by content (`content_id`), not by the spelling of their paths."""
    return flat_record({"grpo": _quiet(settings), "sampling": sampling, "spec": _with_policy(spec)})


def flat_record(sections: dict) -> dict:
    """`sections` as one entry per setting, dotted (`grpo.lr`, `spec.inputs.policy_dir`), JSON values; a `spec`
    section's `inputs` by content (`content_id`)."""
    spec = sections.get("spec")
    if spec and "inputs" in spec:
        spec = {**spec, "inputs": {k: content_id(v) for k, v in spec["inputs"].items()}}
    flat = {}

    def walk(value, prefix: str) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, f"{prefix}.{k}")
        else:
            flat[prefix] = value

    walk({**sections, "spec": spec} if "spec" in sections else sections, "")
    return json.loads(json.dumps({k[1:]: v for k, v in flat.items()}, default=str))


def record_hash(record: dict) -> str:
    """The run's key: its record less the settings that only extend it (the trackers' run id, the wandb id)."""
    return spec_hash({k: v for k, v in record.items() if not _extends(k)})


def legacy_resume_key(settings: dict, sampling: dict, spec: dict | None) -> str:
    """The key states were written under before issue 59 (inputs as paths; one hash for everything).

    Its end: this key, `_differences`' branch for a header without a `record`, `Checkpointer._resume_whole` and the
    fixture tests/data/state-before-52 go together at the next change of the state's format (format 3), whose
    reader will refuse, naming the format, every state older than format 2: by then no run of before issue 59 can
    still be in flight, and a finished one is never resumed."""
    return spec_hash({"grpo": _quiet(settings), "sampling": sampling, "spec": _with_policy(spec)})
