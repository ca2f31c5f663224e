"""Atomic output helpers shared by every stage (design.md §6: temp file + rename).

Each writer puts its bytes into a temporary file in the destination's own folder (so the final
``os.replace`` is a same-filesystem rename, atomic on POSIX) and renames it over the target only
after the write succeeded. A killed job therefore leaves either the old file or the new one,
never a truncated one; the temporary file is removed if the write raises.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # heavy imports only for type checkers
    import pandas as pd
    from matplotlib.figure import Figure

__all__ = [
    "atomic_path",
    "atomic_dir",
    "atomic_write_text",
    "atomic_write_json",
    "atomic_write_csv",
    "atomic_write_rows",
    "atomic_save_figure",
    "to_jsonable",
    "non_finite",
    "spec_hash",
    "read_json",
    "InputError",
    "NoSpaceError",
    "space_named",
    "CHECKSUMS",
    "checked_path",
    "sha256_file",
    "record_checksums",
    "verify_checksums",
    "verify_outside",
    "listed_files",
    "save_safetensors",
    "refuse_symlink",
]


class InputError(ValueError):
    """A file or setting the user gave (or an earlier stage wrote) that cannot be used.

    The message names the file (and line) or the key; the CLI prints it as one line, without a traceback.
    """


class NoSpaceError(InputError):
    """A write that failed because its filesystem is full: one line naming the file (torch's own writer says only
    `basic_ios::clear`). What was written before stays whole (the writers are atomic), so a rerun resumes."""


# what torch's zip writer (PyTorchStreamWriter) raises when a write fails: a RuntimeError without the errno
TORCH_WRITE_FAILURES = ("basic_ios::clear", "file write failed", "unexpected pos", "PytorchStreamWriter failed")
LOW_SPACE = 64 << 20  # bytes: below this, a failed write of the torch writer is taken to be for want of space
RUST_NO_SPACE = f"(os error {errno.ENOSPC})"  # how a Rust io::Error (safetensors' writer) shows ENOSPC


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged process may still write on `path`'s filesystem."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _out_of_space(err: BaseException, folder: Path) -> bool:
    """`err` says the filesystem of `folder` is full; measured before the partial file is removed."""
    if isinstance(err, OSError):
        return err.errno == errno.ENOSPC
    if type(err).__name__ == "SafetensorError":  # safetensors' writer (Rust) names the errno in its message alone
        return RUST_NO_SPACE in str(err)
    if isinstance(err, RuntimeError) and any(m in str(err) for m in TORCH_WRITE_FAILURES):
        try:
            return free_bytes(folder) < LOW_SPACE
        except OSError:
            return False
    return False


def _no_space(err: BaseException, path: Path) -> NoSpaceError:
    detail = err.strerror if isinstance(err, OSError) and err.strerror else str(err).strip().splitlines()[-1]
    return NoSpaceError(
        f"no space left on {path} (writing it failed: {detail}); free space on its filesystem and rerun"
    )


@contextlib.contextmanager
def space_named(path: str | os.PathLike) -> Iterator[None]:
    """Writes under `path` whose own errors hide a full filesystem (a tokenizer's save, torch's writer) end with
    NoSpaceError naming `path`; the atomic writers below name their file themselves."""
    path = Path(path)
    try:
        yield
    except BaseException as err:
        for cause in failure_causes(err):
            if (
                isinstance(cause, Exception)
                and not isinstance(cause, NoSpaceError)
                and _out_of_space(cause, path if path.is_dir() else path.parent)
            ):
                raise _no_space(cause, path) from err
        raise


def failure_causes(err: BaseException) -> list[BaseException]:
    """`err`, or each process's failure where torch.distributed.checkpoint gathered them (CheckpointException)."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict):
        return [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return [err]


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files 0600; outputs get the usual permissions (0666 minus the umask) instead.
_FILE_MODE = 0o666 & ~_current_umask()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on clean exit move it onto ``path``.

    For writers that want a file name rather than a handle (``np.savez``, ``fig.savefig``,
    safetensors). The temporary name keeps the target's suffix, so libraries that infer the
    format from the extension still do. Parent folders are created.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, _FILE_MODE)
        os.replace(tmp_path, path)
    except BaseException as err:
        full = _out_of_space(err, path.parent)
        tmp_path.unlink(missing_ok=True)
        if full and not isinstance(err, NoSpaceError):
            raise _no_space(err, path) from err
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder next to ``path``; on clean exit it replaces ``path`` (a folder or nothing).

    For writers of whole folders (``save_pretrained``, sample folders). The old folder is moved aside
    before the new one is renamed in and removed after, so a kill leaves the old or the new folder
    (or, between the two renames, the old one under ``.<name>.old``), never a half-written one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        for p in [tmp, *tmp.rglob("*")]:  # mkdtemp's folder is private: give the usual permissions
            p.chmod(0o777 & ~_current_umask() if p.is_dir() else _FILE_MODE)
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as err:
        full = _out_of_space(err, path.parent)
        shutil.rmtree(tmp, ignore_errors=True)
        if full and not isinstance(err, NoSpaceError):
            raise _no_space(err, path) from err
        raise


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (flushed and fsynced before the rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding=encoding, newline="") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    return Path(path)


def to_jsonable(obj: Any) -> Any:
    """Recursively convert ``obj`` into strict-JSON values.

    Non-finite floats become ``None`` (``json`` would otherwise write the non-standard ``NaN``),
    numpy scalars / arrays become Python numbers / lists, paths become strings, tuples lists.
    """
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy scalar / array, torch tensor
        return to_jsonable(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def non_finite(obj: Any, prefix: str = "") -> dict[str, str]:
    """Key paths of the non-finite floats in ``obj`` and what they were ("nan", "inf", "-inf"):
    the reason beside the ``null`` that ``to_jsonable`` writes in their place."""
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in non_finite(value, f"{prefix}{key}.").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, value in enumerate(obj) for k, v in non_finite(value, f"{prefix}{i}.").items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return {prefix[:-1]: str(obj)}
    return {}


def spec_hash(spec: Any) -> str:
    """Short hash (8 hex digits) of a spec's canonical JSON: the one key under which a stage's
    results and resumable state are stored. Key order does not matter; any value change does."""
    text = json.dumps(to_jsonable(spec), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def read_json(path: str | os.PathLike) -> Any:
    """A JSON file's value; a missing, unreadable or invalid file raises InputError naming the path."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: not valid JSON ({err})") from None


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> Path:
    """Write ``obj`` as strict JSON (NaN / inf -> null; see ``to_jsonable``), newline-terminated."""
    text = json.dumps(to_jsonable(obj), indent=indent, allow_nan=False, sort_keys=False)
    return atomic_write_text(path, text + "\n")


def atomic_write_csv(df: pd.DataFrame, path: str | os.PathLike, index: bool = False, **kwargs: Any) -> Path:
    """Write a DataFrame as CSV atomically (``kwargs`` go to ``DataFrame.to_csv``)."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=index, **kwargs)
    return Path(path)


def atomic_write_rows(path: str | os.PathLike, rows: list[dict]) -> Path:
    """Write dict rows as CSV atomically, the header being every key in first-seen order (no pandas)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    return Path(path)


def atomic_save_figure(
    fig: Figure, prefix: str | os.PathLike, formats: Iterable[str], dpi: int = 150, **kwargs: Any
) -> list[Path]:
    """Save ``fig`` as ``<prefix>.<fmt>`` for every format, each atomically; return the paths.

    ``kwargs`` go to ``Figure.savefig`` (e.g. ``bbox_inches="tight"``, the default here).
    """
    formats = [f.strip().lstrip(".").lower() for f in formats if f.strip()]
    if not formats:
        raise ValueError("no figure format given; pass e.g. formats=['png', 'pdf']")
    kwargs.setdefault("bbox_inches", "tight")
    paths = []
    for fmt in formats:
        path = Path(f"{os.fspath(prefix)}.{fmt}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi, **kwargs)
        paths.append(path)
    return paths


# --- checks carried by the results (issue 27.5) ----------------------------------------------------------
CHECKSUMS = "checksums.json"  # in a folder: {path relative to it: sha256} of the files a stage wrote there


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _written_files(folder: Path) -> list[str]:
    """Every file under `folder` not reached through a link, except the manifest and temporary (dot) files."""
    out = []
    for root, dirs, files in os.walk(folder):  # does not follow linked folders (NOVA's frozen parts)
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            p = Path(root) / name
            if not name.startswith(".") and not p.is_symlink():
                out.append(p.relative_to(folder).as_posix())
    return [n for n in sorted(out) if n != CHECKSUMS]


def _manifest(folder: Path) -> dict[str, str]:
    path = folder / CHECKSUMS
    if not path.is_file():
        return {}
    sums = read_json(path)
    if not isinstance(sums, dict) or not all(
        isinstance(v, str) or (isinstance(v, list) and all(isinstance(h, str) for h in v)) for v in sums.values()
    ):
        raise InputError(f"{path}: expected {{file: sha256, or a list of them while the file is being replaced}}")
    return sums


def listed_files(folder: str | os.PathLike) -> list[str] | None:
    """The files (relative to `folder`) its checksums.json says margrpo wrote there; None where the folder has no
    readable manifest (not a folder margrpo wrote, or one it did not finish writing)."""
    try:
        return sorted(_manifest(Path(folder))) if (Path(folder) / CHECKSUMS).is_file() else None
    except InputError:
        return None


def _accepted(recorded: str | list[str]) -> list[str]:
    return [recorded] if isinstance(recorded, str) else recorded


def record_checksums(folder: str | os.PathLike, names: Iterable[str] | None = None) -> None:
    """Add the sha256 of `names` (relative to `folder`; None: every file written there) to its checksums.json,
    so that a later load tells a changed or damaged file from the one this stage wrote (`verify_checksums`)."""
    d = Path(folder)
    sums = _manifest(d)
    sums.update({n: sha256_file(d / n) for n in (_written_files(d) if names is None else names)})
    atomic_write_json(d / CHECKSUMS, dict(sorted(sums.items())), indent=1)


def verify_checksums(folder: str | os.PathLike, names: Iterable[str] | None = None, *, required: bool = True) -> bool:
    """Each file of `folder`'s checksums.json (or each of `names`) still has its recorded sha256, else InputError
    naming the file. Every folder margrpo writes carries the manifest, so by default a folder without it, or a
    named file it does not list, is refused too; `required=False` (an outside folder: published weights) leaves
    such a folder to the loader's strict key checks. Returns whether the folder has a manifest."""
    d = Path(folder)
    sums = _manifest(d)
    if not (d / CHECKSUMS).is_file():
        if required:
            raise InputError(
                f"{d}: no {CHECKSUMS}; margrpo writes one beside every folder and state it saves (the sha256 "
                "of each file, checked on load), so a changed or damaged file cannot load unnoticed: rerun the "
                "stage that writes this folder"
            )
        return False
    names = None if names is None else list(names)
    if required and names is not None:
        unlisted = [n for n in names if n not in sums]
        if unlisted:
            raise InputError(f"{d / unlisted[0]}: not listed in {d / CHECKSUMS}; it was not written with this folder")
    for name in sums if names is None else [n for n in names if n in sums]:
        path = d / name
        if path.is_file() and sha256_file(path) not in _accepted(sums[name]):  # a missing file is the loader's to name
            raise InputError(
                f"{path}: sha256 differs from the one recorded in {d / CHECKSUMS} when it was written; "
                "the file was changed or damaged since"
            )
    return True


def verify_outside(folder: str | os.PathLike, what: str) -> bool:
    """`verify_checksums` for a folder that may come from outside margrpo (published `what` weights): without a
    manifest it loads with the loader's strict key and shape checks only, and the log says so."""
    if verify_checksums(folder, required=False):
        return True
    import logging

    logging.getLogger(__name__).warning(
        "%s: no %s (not written by margrpo): loading the %s weights with strict key and shape checks only",
        folder,
        CHECKSUMS,
        what,
    )
    return False


def content_id(path: str | os.PathLike | None) -> str | None:
    """An input folder or file by what it holds, not by how its path is spelled: the sha256 of its manifest
    (checksums.json, every file's sha256) or of its stage's spec.json (the settings that wrote it), of a file's
    bytes; a folder with neither is named by its resolved path. A resume key built on these survives
    `--policy-dir results/...` against `/abs/results/...` and a re-placed copy of the same weights."""
    if path is None:
        return None
    path = Path(path)
    for name in (CHECKSUMS, "spec.json"):
        if (path / name).is_file():
            return f"{name}:{sha256_file(path / name)[:16]}"
    if path.is_file():
        return f"file:{sha256_file(path)[:16]}"
    return f"path:{path.resolve()}"


@contextlib.contextmanager
def checked_path(path: str | os.PathLike) -> Iterator[Path]:
    """`atomic_path` for a file its folder's checksums.json vouches for and that is rewritten in place (resumable
    state). The new sha256 is recorded beside the old one before the move and alone after it: a process killed at
    any instant leaves a file whose hash the record accepts, so the next run resumes instead of starting over."""
    path = Path(path)
    with atomic_path(path) as tmp:
        yield tmp
        sums = _manifest(path.parent)
        new = sha256_file(tmp)
        sums[path.name] = list(dict.fromkeys(_accepted(sums.get(path.name, [])) + [new]))
        atomic_write_json(path.parent / CHECKSUMS, dict(sorted(sums.items())), indent=1)
    sums[path.name] = new
    atomic_write_json(path.parent / CHECKSUMS, dict(sorted(sums.items())), indent=1)


def save_safetensors(tensors: dict, path: str | os.PathLike) -> None:
    """safetensors' save_file, atomically and with the usual permissions (it creates its files 0600)."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})


def refuse_symlink(path: str | os.PathLike, what: str = "folder") -> Path:
    """`path` itself, unless it is a symbolic link: a stage that clears or rewrites a folder never does so
    through one."""
    path = Path(path)
    if path.is_symlink():
        raise InputError(
            f"{path}: is a symbolic link (to {os.readlink(path)}); the {what} is cleared and rewritten, "
            "so it must be a real folder"
        )
    return path


def state_mismatch(state: dict, expected: dict) -> str:
    """What differs between a loaded state dict and a model's (missing / unexpected keys, shapes), in one
    line for an error that names the files; "" when they agree."""
    missing, unexpected = sorted(expected.keys() - state.keys()), sorted(state.keys() - expected.keys())
    shapes = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    return "; ".join(
        f"{name} ({len(keys)}): {', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''}"
        for name, keys in (("missing", missing), ("unexpected", unexpected), ("shape (file vs config)", shapes))
        if keys
    )
