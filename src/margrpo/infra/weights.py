"""Where released weights are, what each config key needs, and reading `.pth` files safely.

One module for every model the pipeline loads but does not train here: the real policies and scorers, and the toy's
shipped weights with their manifest.

**Lookup.** A config value naming weights is a local path (as before) or a Hugging Face repository id,
`owner/name` or `owner/name@revision` (a branch, tag or commit). A path that exists wins. Otherwise an id resolves
offline, as `from_pretrained(..., local_files_only=True)` does, to the snapshot folder of the local Hugging Face
cache (huggingface_hub's layout):

    $HF_HUB_CACHE (default $HF_HOME/hub, $HF_HOME default ~/.cache/huggingface)
      models--{owner}--{name}/refs/{revision}        the commit a branch or tag points at
      models--{owner}--{name}/snapshots/{commit}/... the repository's files (links into blobs/)

Nothing is downloaded: HF_HUB_OFFLINE stays on (margrpo's CLI sets it). A missing model's message gives the exact
`hf download` command that fetches it.

**Needs.** `needs(config)` lists, for a validated config, every model it needs: the config key, the repository
it comes from, the files the folder (or file) must hold. `check(need)` says where it looked, what it found (files
and sizes) or the command for what is missing. `margrpo weights --config ...`, the DAG's `check_weights` and
the weights table of docs/real-scale.md (`markdown_table`) all read this list.

**The toy's release.** The toy's trained stages (toyclip, toypref, the base policies' pre-training) ship in the
package like a release (margrpo/data/toy_weights/: the stage folders as the pipeline wrote them, and manifest.json:
per folder its settings, the code it depends on with a digest of that code, quality metrics, the sha256 of each
file; the commit, CPU and torch it was trained with). `fresh_folders` says which a config can take: same settings
and same code, else the DAG trains the stage; `place_folder` copies one into results/ after checking every file.

**Pickles.** `load_tensor_file` reads a `.pth`/`.ckpt` with `torch.load(weights_only=True)` only. A file that
pickles more than tensors (an `argparse.Namespace` of training arguments, as research checkpoints often do) is
refused with a message naming the file, the non-tensor types it holds and a safe way forward; margrpo has no
switch for an unrestricted load.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# A Hugging Face repository id, optionally @revision (huggingface_hub's REPO_ID rules: letters, digits, - _ .).
REPO_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96})(?:@(?P<revision>[\w./-]+))?")
COMMIT = re.compile(r"[0-9a-f]{40}")


# ============================================================================ the Hugging Face cache
@dataclass(frozen=True)
class RepoRef:
    """A repository id and the revision asked for (None: "main")."""

    repo: str
    revision: str | None = None

    @property
    def cache_folder(self) -> str:
        return "models--" + self.repo.replace("/", "--")

    def download_command(self, files: Sequence[str] = (), local_dir: str | Path | None = None) -> str:
        """The `hf download` command (huggingface_hub's CLI) that fetches `files` (all: none named)."""
        parts = ["hf download", self.repo, *files]
        if self.revision:
            parts += ["--revision", self.revision]
        if local_dir is not None:
            parts += ["--local-dir", str(local_dir)]
        return " ".join(parts)


def parse_repo_id(spec: str | Path) -> RepoRef | None:
    """The repository id in `spec`, or None when it cannot be one (an absolute, ~ or ./ path, several slashes)."""
    text = str(spec)
    if text.startswith(("/", "~", ".")) or not (m := REPO_ID.fullmatch(text)):
        return None
    return RepoRef(m["repo"], m["revision"])


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, read from the environment at call time (as huggingface_hub does)."""
    if cache := os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "huggingface"
    return Path(home).expanduser() / "hub"


def cached_snapshot(ref: RepoRef) -> Path | None:
    """The snapshot folder of `ref` in the cache, or None. A commit names its snapshot; a branch or tag is read
    from refs/ (huggingface_hub's layout)."""
    repo = hub_cache() / ref.cache_folder
    revision = ref.revision or "main"
    if not COMMIT.fullmatch(revision):
        pointer = repo / "refs" / revision
        if not pointer.is_file():
            return None
        revision = pointer.read_text().strip()
    snapshot = repo / "snapshots" / revision
    return snapshot if snapshot.is_dir() else None


def resolve_weights(spec: str | Path) -> Path:
    """A local path that exists, else the cached snapshot of a repository id; FileNotFoundError otherwise
    (naming both places looked and the `hf download` command)."""
    local = Path(spec).expanduser()
    if local.exists():
        return local
    ref = parse_repo_id(spec)
    if ref is None:
        return local  # a plain path: the loader names the files it expected there
    if (snapshot := cached_snapshot(ref)) is not None:
        return snapshot
    raise FileNotFoundError(
        f"{spec}: no such local path ({local.resolve()}), and repository {ref.repo!r}"
        f"{f' at revision {ref.revision!r}' if ref.revision else ''} is not in the Hugging Face cache "
        f"({hub_cache() / ref.cache_folder}); fetch it with `{ref.download_command()}` (or put the files at that path)"
    )


# ============================================================================ folder layouts
# Each layout is a list of groups; a group is satisfied by any one of its files.
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")
NOVA_LAYOUT = (
    ("model_index.json",),
    ("transformer/config.json",),
    ("transformer/diffusion_pytorch_model.safetensors",),
    ("vae/config.json",),
    ("vae/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.bin"),
    ("text_encoder/config.json",),
    tuple(f"text_encoder/{f}" for f in WEIGHT_FILES),
    ("tokenizer/tokenizer_config.json", "tokenizer/tokenizer.json"),
)
# wusize/harmon's release files plus Qwen2.5-1.5B-Instruct's config and tokenizer (margrpo.policy.harmon)
HARMON_RELEASE_LAYOUT = (
    ("harmon_1.5b.pth",),
    ("kl16.ckpt",),
    ("Qwen2.5-1.5B-Instruct/config.json",),
    ("Qwen2.5-1.5B-Instruct/tokenizer.json",),
    ("Qwen2.5-1.5B-Instruct/tokenizer_config.json",),
)
# the transformers-format wusize/Harmon-1_5B folder (margrpo.policy.harmon_files)
HARMON_HF_LAYOUT = (("config.json",), ("model.safetensors", "model.safetensors.index.json"), TOKENIZER_FILES)
TRANSFORMERS_MODEL = (("config.json",), WEIGHT_FILES)
TRANSFORMERS_PROCESSOR = (("preprocessor_config.json",), TOKENIZER_FILES)
LAYOUTS: dict[str, tuple[tuple[tuple[str, ...], ...], ...]] = {
    "nova": (NOVA_LAYOUT,),
    "harmon": (HARMON_HF_LAYOUT, HARMON_RELEASE_LAYOUT),
    "toy": ((("config.json",), ("model.safetensors",)),),
    "transformers": (TRANSFORMERS_MODEL,),
    "processor": (TRANSFORMERS_PROCESSOR,),
    "transformers+processor": ((*TRANSFORMERS_MODEL, *TRANSFORMERS_PROCESSOR),),
}


def missing_files(folder: Path, layout: Sequence[Sequence[str]]) -> list[str]:
    """The groups of `layout` that `folder` lacks, each as "a or b" (paths under the folder)."""
    return [
        " or ".join(str(folder / f) for f in group)
        for group in layout
        if not any(_nonempty(folder / f) for f in group)
    ]


def _nonempty(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


# ============================================================================ what a config needs
@dataclass(frozen=True)
class Source:
    """Where a model is published: a repository, the files of it a key needs (none: the whole repository),
    and the folder layout it has (None: the key names one file)."""

    repo: str
    files: tuple[str, ...] = ()
    layout: str | None = None
    note: str = ""


# Every config key that names released weights, and where those weights are published.
SOURCES: dict[str, Source] = {
    "policies.nova": Source("BAAI/nova-d48w1024-sd512", layout="nova", note="NOVA-0.6B, diffusers layout"),
    "policies.harmon": Source(
        "wusize/Harmon-1_5B",
        layout="harmon",
        note="transformers format; or wusize/harmon's harmon_1.5b.pth + kl16.ckpt + Qwen2.5-1.5B-Instruct/",
    ),
    "reward_models.hpsv2.path": Source("xswu/HPSv2", ("HPS_v2.1_compressed.pt",), note="HPS v2.1"),
    "reward_models.hpsv2.clip_path": Source(
        "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        ("open_clip_config.json",),
        layout="open_clip",
        note="open_clip's ViT-H-14 architecture (every weight is in the HPS file)",
    ),
    "reward_models.git_vqa.path": Source("microsoft/git-large-vqav2", layout="transformers+processor"),
    "reward_models.vqa.path": Source("Salesforce/blip-vqa-capfilt-large", layout="transformers+processor"),
    "reward_models.grounding_dino.path": Source(
        "IDEA-Research/grounding-dino-tiny",
        layout="transformers+processor",
        note="the transformers port of MAR-GRPO's groundingdino_swint_ogc.pth (Swin-T)",
    ),
    "reward_models.imagereward.path": Source("THUDM/ImageReward", ("ImageReward.pt",)),
    "reward_models.imagereward.med_config": Source("THUDM/ImageReward", ("med_config.json",)),
    "reward_models.imagereward.tokenizer_path": Source(
        "google-bert/bert-base-uncased", ("config.json", "tokenizer_config.json", "vocab.txt"), layout="bert"
    ),
    "reward_models.pickscore.path": Source("yuvalkirstain/PickScore_v1", layout="transformers"),
    "reward_models.pickscore.processor_path": Source(
        "laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"),
        layout="processor",
        note="its processor files only",
    ),
    "reward_models.clipscore.path": Source("openai/clip-vit-large-patch14", layout="transformers+processor"),
    "reward_models.aesthetic.clip_path": Source("openai/clip-vit-large-patch14", layout="transformers+processor"),
    "evaluation.compbench_models.vqa.path": Source(
        "Salesforce/blip-vqa-capfilt-large", layout="transformers+processor"
    ),
    "evaluation.compbench_models.detector.path": Source(
        "IDEA-Research/grounding-dino-base", layout="transformers+processor"
    ),
    "evaluation.compbench_models.clip.path": Source("openai/clip-vit-base-patch32", layout="transformers+processor"),
}
# Keys whose weights are not on the Hugging Face hub: where to get them.
ELSEWHERE = {
    "reward_models.aesthetic.path": "github.com/christophschuhmann/improved-aesthetic-predictor "
    "(sac+logos+ava1-l14-linearMSE.pth)",
}
LAYOUTS.update({"open_clip": ((("open_clip_config.json", "ViT-H-14.json"),),), "bert": ((("vocab.txt",),),)})


@dataclass(frozen=True)
class Need:
    """One model a config needs: its key, the value there and where that is published."""

    key: str
    value: str
    source: Source | None  # None: a key this module has no record of (checked as a plain path)
    kind: str | None = None  # a policy's kind: its folder layout


def needs(config: dict) -> list[Need]:
    """Every released model a (validated) config names, in config order: non-toy policies, reward models,
    the CompBench evaluator's models."""
    out = []
    for name, policy in (config.get("policies") or {}).items():
        if policy.get("kind") in ("nova", "harmon") and policy.get("path"):
            out.append(
                Need(
                    f"policies.{name}.path", str(policy["path"]), SOURCES[f"policies.{policy['kind']}"], policy["kind"]
                )
            )
    for name, entry in (config.get("reward_models") or {}).items():
        for option, value in entry.items():
            if (option.endswith("path") or option == "med_config") and value:
                key = f"reward_models.{name}.{option}"
                out.append(Need(key, str(value), SOURCES.get(key)))
    models = (config.get("evaluation") or {}).get("compbench_models") or {}
    for name, entry in models.items():
        if isinstance(entry, dict) and entry.get("path"):
            key = f"evaluation.compbench_models.{name}.path"
            out.append(Need(key, str(entry["path"]), SOURCES.get(key)))
    return out


@dataclass
class Finding:
    """What `check` saw for one need."""

    need: Need
    looked: list[str] = field(default_factory=list)  # the places tried, in order
    found: Path | None = None
    files: list[tuple[str, int]] = field(default_factory=list)  # (path under `found`, bytes)
    missing: list[str] = field(default_factory=list)
    command: str = ""  # how to fetch what is missing

    @property
    def ok(self) -> bool:
        return self.found is not None and not self.missing


def check(need: Need, root: Path | None = None) -> Finding:
    """Look for one need: the local path (relative to `root`, default the working directory), then, for a
    repository id, the Hugging Face cache; list what is there and, if anything is missing, the command."""
    finding = Finding(need)
    local = Path(need.value).expanduser()
    local = local if local.is_absolute() or root is None else root / local
    finding.looked.append(f"path {local.resolve()}")
    candidates = [local] if local.exists() else []
    ref = parse_repo_id(need.value)
    if ref is not None and not candidates:
        snapshot = cached_snapshot(ref)
        finding.looked.append(f"Hugging Face cache {hub_cache() / ref.cache_folder} ({ref.revision or 'main'})")
        candidates += [snapshot] if snapshot is not None else []
    layouts = _layouts(need)
    if candidates:
        finding.found = candidates[0]
        finding.missing = _best_missing(finding.found, layouts, need)
        finding.files = _listing(finding.found)
    else:
        finding.missing = [str(local)]
    if finding.missing:
        finding.command = _command(need, local, ref)
    return finding


def _layouts(need: Need):
    if need.kind is not None:
        return LAYOUTS[need.kind]
    if need.source is not None and need.source.layout is not None:
        return LAYOUTS[need.source.layout]
    return None  # a file (or an unknown key: anything that exists)


def _best_missing(found: Path, layouts, need: Need) -> list[str]:
    """Missing files of the layout `found` comes closest to (for a file key: whether it is a non-empty file)."""
    if layouts is None:
        if need.source is not None and need.source.files and not _nonempty(found):
            return [str(found)]
        return []
    if not found.is_dir():
        return [f"{found} is not a folder"]
    return min((missing_files(found, layout) for layout in layouts), key=len)


def _listing(found: Path, limit: int = 40) -> list[tuple[str, int]]:
    if found.is_file():
        return [(found.name, found.stat().st_size)]
    files = sorted(p for p in found.rglob("*") if p.is_file())
    return [(str(p.relative_to(found)), p.stat().st_size) for p in files[:limit]]


def _command(need: Need, local: Path, ref: RepoRef | None) -> str:
    """`hf download` of the repository the value names (into the cache), or of the key's known source into the
    local path (--local-dir)."""
    source = need.source
    # `weights/x` is both a relative path and a repository id: with a known source, an id other than it is a path
    if ref is not None and (source is None or ref.repo == source.repo):
        return ref.download_command(source.files if source and ref.repo == source.repo else ())
    if source is None:
        return ""
    if source.layout is None or source.files:  # named files: into the folder (or, for a file key, its parent)
        folder = local if source.layout else local.parent
        command = RepoRef(source.repo).download_command(source.files, folder)
        if source.layout is None and local.name != source.files[0]:
            command += f" && mv {folder / source.files[0]} {local}"
        return command
    return RepoRef(source.repo).download_command((), local)


def report(findings: Sequence[Finding]) -> str:
    """The listing `margrpo weights` prints: per key, where it looked, found or missing, and the command."""
    lines = []
    for f in findings:
        status = "found" if f.ok else "MISSING"
        lines.append(f"{f.need.key} = {f.need.value}: {status}")
        if f.need.key in ELSEWHERE:
            lines.append(f"  from: {ELSEWHERE[f.need.key]}")
        if f.need.source is not None:
            lines.append(f"  from: {f.need.source.repo}" + (f" ({f.need.source.note})" if f.need.source.note else ""))
        lines += [f"  looked: {place}" for place in f.looked]
        if f.found is not None:
            lines.append(f"  at: {f.found}")
            lines += [f"    {name}  {_size(size)}" for name, size in f.files]
        lines += [f"  missing: {m}" for m in f.missing]
        if f.command:
            lines.append(f"  fetch: {f.command}")
    n_missing = sum(not f.ok for f in findings)
    lines.append(f"{len(findings)} models, {n_missing} missing" + ("" if n_missing else ": all found"))
    return "\n".join(lines)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def markdown_table() -> str:
    """docs/real-scale.md's weights table: every config key this module knows and where its weights are published."""
    rows = ["| config key | Hugging Face repository | files |", "|---|---|---|"]
    for key, s in SOURCES.items():
        files = ", ".join(f"`{f}`" for f in s.files) or "the whole repository"
        note = f" ({s.note})" if s.note else ""
        rows.append(f"| `{key}{'.path' if key.startswith('policies.') else ''}` | `{s.repo}`{note} | {files} |")
    return "\n".join(rows)


# ============================================================================ pickled checkpoints
def load_tensor_file(path: Path) -> dict:
    """A `.pth` / `.ckpt` state dict through `torch.load(weights_only=True)`. A file that pickles more than
    tensors raises ValueError naming the file, the types it holds and a safe way forward."""
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # zip / pickle errors of a truncated or foreign file, or the restricted unpickler's
        if globals_found := _unsafe_globals(path):
            raise ValueError(_pickle_message(path, globals_found)) from err
        raise ValueError(f"{path}: corrupt or unreadable weights ({type(err).__name__}: {err})") from err
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a state dict, got {type(obj).__name__}")
    return obj


def _unsafe_globals(path: Path) -> list[str]:
    """The classes and functions the pickle in `path` names that weights_only does not allow (none readable: [])."""
    import torch

    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception:  # not a torch zip file at all
        return []


def _pickle_message(path: Path, found: list[str]) -> str:
    """The refusal: what the file holds, why it is not loaded, and a recipe that stays within weights_only."""
    modules = sorted({n.rpartition(".")[0] for n in found})
    allowed = ", ".join(found)
    return (
        f"{path}: holds more than tensors: its pickle also stores {allowed}. margrpo reads weights with "
        "torch.load(weights_only=True) only (a pickle can run code; there is no switch for an unrestricted load). "
        "If you trust where the file comes from, re-save its tensors once, allowing just those types (still "
        f"weights_only):\n    import torch, {', '.join(modules)}\n"
        f"    with torch.serialization.safe_globals([{allowed}]):\n"
        f"        ckpt = torch.load({str(path)!r}, weights_only=True, map_location='cpu')\n"
        "    torch.save({k: v for k, v in ckpt.items() if isinstance(v, (dict, torch.Tensor))}, "
        f"{str(path) + '.tensors.pth'!r})\n"
        "then point the config at the .tensors.pth file (or use a safetensors release of the same weights)."
    )


# ============================================================================ the toy's release
PACKAGE = Path(__file__).resolve().parents[1]  # margrpo/
RELEASE = PACKAGE / "data" / "toy_weights"
MANIFEST = "manifest.json"


def source_digest(files: Sequence[str], package: Path = PACKAGE) -> str:
    """sha256 of the code of `files` (paths under margrpo/) read as syntax trees without their docstrings: formatting,
    comments and docstrings leave it alone, any change of code moves it."""
    h = hashlib.sha256()
    for name in sorted(files):
        tree = ast.parse((package / name).read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
                if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                    node.body = body[1:] or [ast.Pass()]
        h.update(f"{name}\0{ast.dump(tree)}\0".encode())
    return h.hexdigest()


def cpu_description() -> dict:
    """The CPU's model and the vector instruction sets torch's CPU kernels choose between (Linux /proc/cpuinfo)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    isa = sorted(set(flags.group(1).split()) & {"avx2", "avx512f", "avx512_bf16", "amx_tile", "fma"}) if flags else []
    return {"model": model.group(1).strip() if model else os.uname().machine, "isa": isa}


def read_manifest(release: Path = RELEASE) -> dict:
    """The release's manifest ({} where nothing ships); a manifest that does not parse names its file."""
    path = Path(release) / MANIFEST
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err}); regenerate the release with `make toy-weights`") from err


def fresh_folders(wanted: dict[str, dict], release: Path = RELEASE) -> tuple[list[str], dict[str, str]]:
    """Of `wanted` ({results folder: {"stage", "settings", "sources"}}, `experiment.specs.toy_stages`), the folders the
    release holds for the same settings and code, and {folder: why not} for the others."""
    shipped = read_manifest(release).get("folders", {})
    fresh, stale, digests = [], {}, {}  # digests: one per source list (the two base policies share theirs)
    for folder, want in wanted.items():
        sources = tuple(want["sources"])
        if sources not in digests:
            digests[sources] = source_digest(sources)
        entry = shipped.get(release_key(folder))
        if entry is None:
            stale[folder] = "not in the release"
        elif entry["settings"] != json.loads(json.dumps(want["settings"])):
            stale[folder] = "shipped with other settings"
        elif entry["sources"] != want["sources"] or digests[sources] not in (
            entry["source_digest"],
            *entry.get("equivalent_digests", []),  # later code proved to move no number (refresh-release)
        ):
            stale[folder] = (
                f"the code of its stage ({want['stage']}) changed since it was trained (`make toy-weights-check` "
                "keeps it if no number moved)"
            )
        elif missing := [f for f in entry["files"] if not (Path(release) / release_key(folder) / f).is_file()]:
            stale[folder] = f"the release lacks {missing[0]}"
        else:
            fresh.append(folder)
    return fresh, stale


def place_folder(folder: str, release: Path = RELEASE) -> None:
    """Copy the shipped `folder` (results/<stage>/<name>) into place, each file checked against the manifest's
    sha256 first: a changed byte is refused, naming the file, and nothing is placed."""
    from margrpo.infra.files import InputError, atomic_dir, atomic_path, sha256_file

    key = release_key(folder)
    entry = read_manifest(release).get("folders", {}).get(key)
    if entry is None:
        raise InputError(f"{Path(release) / MANIFEST}: ships no {key}")
    src = Path(release) / key
    for name, digest in entry["files"].items():
        if sha256_file(src / name) != digest:
            raise InputError(
                f"{src / name}: its sha256 differs from the release's manifest (a damaged or edited file); "
                "reinstall margrpo, or regenerate the release with `make toy-weights`"
            )
    top = sorted({name.split("/")[0] for name in entry["files"]})
    for name in top:
        target = Path(folder) / name
        if (src / name).is_dir():
            with atomic_dir(target) as tmp:
                shutil.copytree(src / name, tmp, dirs_exist_ok=True)
        else:
            with atomic_path(target) as tmp:
                shutil.copyfile(src / name, tmp)


def release_key(folder: str) -> str:
    """A results folder's name in the release: results/pretrain/toy-nova-1a2b3c4d -> pretrain/toy-nova-1a2b3c4d."""
    return "/".join(Path(folder).parts[-2:])
