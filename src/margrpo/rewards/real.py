"""Real-scale reward models and metrics (DESIGN 5), every one loaded from local files.

Nothing is downloaded: each scorer takes the local path(s) of its weights as keyword options
(config `reward_models.<name>`), and a missing path raises FileNotFoundError naming the files
expected there and where to get them. Each model is built once in the constructor; `__call__`
batches internally (`batch_size=`) under `torch.no_grad()` on the `device=` option (default
"cpu"); images are quantised to 8-bit RGB and go through each model's reference preprocessing
(its Hugging Face processor or its package's transform), as a saved PNG would.

| name | model | score per image |
|---|---|---|
| `pickscore` | PickScore_v1 (transformers CLIPModel) | exp(logit_scale) * cos(img, txt), raw (about 18-24) |
| `clipscore` | CLIP (transformers CLIPModel) | `form="cosine"`: cos(img, txt) (T2I-CompBench); `"clipscore_100"`: 100 * max(cos, 0) |
| `aesthetic` | CLIP ViT-L/14 image embedding, L2-normalised, -> LAION improved-aesthetic MLP | MLP output (about 1-10) |
| `vqa` | BLIP-VQA (transformers BlipForQuestionAnswering) | prod over noun phrases of P(yes | "{phrase}?") (T2I-CompBench) |
| `git_vqa` | GIT (transformers GitForCausalLM, e.g. git-large-vqav2) | mean over noun phrases of P(yes | "{phrase}?") (T2I-R1) |
| `grounding_dino` | Grounding DINO (transformers AutoModelForZeroShotObjectDetection) | T2I-R1 detection reward: relation / count / presence |
| `hpsv2` | HPS v2.1 (hpsv2's open_clip ViT-H-14) | cos(img, txt) (hpsv2's `score`) |
| `imagereward` | ImageReward-v1.0 (image-reward package) | (MLP(BLIP cross-attended [CLS]) - mean) / std |

P(yes) is p_yes / (p_yes + p_no) of the answer's first token, as T2I-CompBench (BLIP) and T2I-R1
(GIT) compute it. hpsv2 and imagereward need packages that live only in the evaluator
environment (`.venv-eval`, `make evaluators`); their imports happen in the constructor.

Prompt analysis (noun phrases, spatial relations, object counts) is rule-based and documented at
`noun_phrases`, `parse_relation` and `parse_counts`; where a prompt's metadata carries the
T2I-R1 fields (`task_type`, `nouns`, `attr_nouns`, `spatial_info`, `numeracy_info`, as in
`src/margrpo/data/mar-grpo/train_prompts.jsonl`), those are used instead of the rules.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from margrpo.rewards.registry import register_reward

__all__ = [
    "AestheticMLP",
    "AestheticReward",
    "BlipVQAReward",
    "ClipScoreReward",
    "Detections",
    "DetectionTask",
    "GitVQAReward",
    "GroundingDinoReward",
    "HPSv2Reward",
    "ImageRewardReward",
    "PickScoreReward",
    "Relation",
    "box_iou",
    "count_boxes",
    "count_match_score",
    "detection_task",
    "nms",
    "noun_phrases",
    "object_name",
    "parse_counts",
    "parse_relation",
    "relation_score",
    "singular",
    "t2i_r1_numeracy_score",
    "t2i_r1_presence_score",
    "t2i_r1_spatial_score",
    "vqa_phrases",
]

EVALUATOR_HINT = "install the evaluator stack: make evaluators (or envs/evaluators.yaml)"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
PROCESSOR_FILES = ("preprocessor_config.json",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json")


# ============================================================================ local files


def _require_file(path: str | Path | None, reward: str, option: str, expected: str, source: str) -> Path:
    """`path` as a Path if it is a file; else FileNotFoundError naming the file and where to get it."""
    if path is None:
        raise ValueError(f"{reward}: option {option!r} is required ({expected}; from {source})")
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(
            f"{reward}: {p} not found (expected {expected}); download it from {source} "
            f"and point reward_models.{reward}.{option} at it"
        )
    return p


def _require_pretrained(
    path: str | Path | None, reward: str, option: str, source: str, kind: str = "model"
) -> Path:
    """A folder written by `save_pretrained`: config.json + weights ("model") or processor files."""
    if path is None:
        raise ValueError(f"{reward}: option {option!r} is required (a local {kind} folder; from {source})")
    p = Path(path).expanduser()
    if kind == "model":
        need, any_of = ("config.json",), WEIGHT_FILES
    else:  # processor: image preprocessing config + a tokenizer
        need, any_of = PROCESSOR_FILES, TOKENIZER_FILES
    missing = [f for f in need if not (p / f).is_file()]
    if not p.is_dir() or missing or not any((p / f).is_file() for f in any_of):
        expected = " + ".join(need) + " and one of " + " / ".join(any_of)
        raise FileNotFoundError(
            f"{reward}: {p} not found or incomplete (expected a {kind} folder with {expected}, as written by "
            f"save_pretrained); download {source} into it and point reward_models.{reward}.{option} at it"
        )
    return p


def _model_and_processor(path, processor_path, reward: str, source: str, processor_source: str | None = None) -> tuple[Path, Path]:
    """The model folder (`path`) and its processor folder (`processor_path`, default: the model's)."""
    model_dir = _require_pretrained(path, reward, "path", source)
    proc_dir = _require_pretrained(processor_path or path, reward, "processor_path" if processor_path else "path",
                                   processor_source or source, kind="processor")
    return model_dir, proc_dir


def _prepare_transformers() -> None:
    """transformers' image processors import torchvision when it is installed; in the evaluator
    environment that is the CUDA build, which needs the CPU-torch workaround first (compat.py)."""
    import importlib.util

    if importlib.util.find_spec("torchvision") is not None:
        from margrpo.compat import ensure_torchvision_importable

        ensure_torchvision_importable()


def _import_evaluator_package(reward: str, module: str, package: str) -> None:
    """Import `module` (of pip package `package`), or raise an ImportError saying how to install it."""
    from margrpo.compat import ensure_torchvision_importable

    ensure_torchvision_importable()  # both packages import torchvision (CPU torch + its CUDA build)
    try:
        __import__(module)
    except ImportError as err:
        raise ImportError(
            f"{reward}: the {package!r} package is not importable here ({err}); {EVALUATOR_HINT}, "
            f"and run with .venv-eval/bin/python"
        ) from err


# ============================================================================ batching helpers


def _check_batch(images: Tensor, prompts: Sequence[str], metadata: Sequence[dict] | None) -> list[dict]:
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"images must be [B, 3, H, W] in [0, 1], got shape {tuple(images.shape)}")
    if len(prompts) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
    metadata = list(metadata) if metadata is not None else [{} for _ in prompts]
    if len(metadata) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(metadata)} metadata entries")
    return [m or {} for m in metadata]


def _to_pil(images: Tensor) -> list:
    """[B, 3, H, W] float in [0, 1] -> B PIL RGB images (8-bit, as a saved PNG)."""
    from PIL import Image

    pixels = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8)  # [B, 3, H, W]
    array = pixels.permute(0, 2, 3, 1).cpu().numpy()  # [B, H, W, 3]
    return [Image.fromarray(a) for a in array]


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def _check_batch_size(batch_size: int) -> int:
    if int(batch_size) < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    return int(batch_size)


def _text_max_length(tokenizer, config_max: int) -> int:
    """Truncation length: the tokenizer's limit, capped by the model's position table."""
    limit = getattr(tokenizer, "model_max_length", None) or config_max
    return int(min(limit, config_max))


# ============================================================================ prompt rules
#
# A small, documented rule set stands in for a POS tagger (T2I-CompBench uses spaCy, which is not
# part of either environment). Words are split at punctuation, conjunctions, prepositions, a list
# of common verbs, and -ed/-ing verbs that take an object; what remains are the noun phrases.

_PUNCT = {",", ".", ";", ":", "!", "?"}
_DETERMINERS = {
    "a", "an", "the", "this", "that", "these", "those", "its", "his", "her", "their", "our", "my", "your",
    "some", "each", "every", "another", "any", "no", "all",
}
_PRONOUNS = {
    "it", "they", "them", "he", "she", "him", "we", "us", "i", "you", "itself", "themselves", "himself", "herself",
}
_SPATIAL_NOUNS = {"top", "bottom", "left", "right", "side", "front", "back", "middle", "center", "centre"}
_CONJUNCTIONS = {"and", "or", "but", "while", "as", "then", "so", "because", "where", "which", "who", "that's"}
_PREPOSITIONS = {
    "of", "on", "in", "at", "to", "with", "by", "from", "near", "next", "beside", "behind", "under", "over",
    "above", "below", "into", "onto", "inside", "outside", "against", "past", "through", "across", "around",
    "between", "for", "like", "than", "underneath", "beneath", "atop", "toward", "towards", "along", "among",
    "within", "without", "upon", "after", "before", "during", "beyond", "amid", "out", "up", "down", "off", "away",
}
_VERBS = {
    "is", "are", "was", "were", "be", "been", "being", "am", "has", "have", "had", "do", "does", "did",
    "can", "could", "will", "would", "should", "may", "might", "must",
    "lay", "lays", "lies", "lie", "sat", "sits", "sit", "stood", "stands", "stand", "hung", "hangs", "held",
    "holds", "rests", "looks", "ran", "runs", "flew", "flies", "ate", "eats", "drank", "drinks", "slept",
    "sleeps", "swam", "swims", "sang", "sings", "rode", "rides", "drove", "drives", "grew", "grows", "fell",
    "falls", "took", "takes", "gave", "gives", "made", "makes", "caught", "catches", "threw", "throws",
    "wore", "wears", "built", "builds", "sees", "saw", "shines", "shone", "glows", "adds", "add", "gets",
    "got", "goes", "went", "came", "comes", "reads", "read", "sleep", "play", "plays", "walks", "led", "leads",
    "hold", "give", "take", "make", "get", "see", "keep", "keeps", "kept", "contains", "covers", "reflects",
}
_COLOURS = {
    "black", "white", "red", "green", "blue", "yellow", "brown", "pink", "purple", "orange", "gray", "grey",
    "gold", "golden", "silver", "beige", "violet", "cyan", "magenta",
}
_NUMBERS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12,
}
_INDEFINITE = {"a", "an"}
_PHOTO_PREFIX = re.compile(r"^\s*(?:a|an)\s+(?:photo|picture|image|painting|drawing)\s+of\s+", re.IGNORECASE)
_TOKEN = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*|[,.;:!?]")
_IRREGULAR_SINGULAR = {
    "people": "person", "men": "man", "women": "woman", "children": "child", "mice": "mouse",
    "geese": "goose", "teeth": "tooth", "feet": "foot", "oxen": "ox", "knives": "knife", "wives": "wife",
    "wolves": "wolf", "leaves": "leaf", "shelves": "shelf", "loaves": "loaf", "halves": "half",
    "calves": "calf", "scarves": "scarf", "tomatoes": "tomato", "potatoes": "potato", "mangoes": "mango",
    "heroes": "hero", "cacti": "cactus", "sheep": "sheep", "fish": "fish", "deer": "deer",
    "series": "series", "species": "species", "bus": "bus", "buses": "bus", "glasses": "glasses",
}
_NOT_PLURAL_ENDINGS = ("ss", "us", "is", "ous")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _count_of(word: str) -> int | None:
    w = word.lower()
    if w in _NUMBERS:
        return _NUMBERS[w]
    return int(w) if w.isdigit() else None


def _verb_like(word: str) -> bool:
    w = word.lower()
    return len(w) > 4 and (w.endswith("ed") or w.endswith("ing"))


def _is_boundary(words: list[str], i: int, chunk: list[str]) -> bool:
    """Whether words[i] ends the current noun phrase (and is not part of any)."""
    w = words[i].lower()
    prev = words[i - 1].lower() if i > 0 else None
    nxt = words[i + 1].lower() if i + 1 < len(words) else None
    if w == "," and len(chunk) == 2 and chunk[0].lower() in _DETERMINERS and nxt is not None and (
        nxt not in _DETERMINERS and nxt not in _CONJUNCTIONS and _count_of(nxt) is None and not _verb_like(nxt)
    ):  # "A long, narrow black kitchen": a comma between the adjectives of one phrase
        return False
    if w in _PUNCT:
        return True
    if w == "and" and prev in _COLOURS and nxt in _COLOURS:  # "black and white cat" is one phrase
        return False
    if w in _CONJUNCTIONS or w in _PREPOSITIONS or w in _VERBS:
        return True
    if _verb_like(w):
        # an -ed/-ing word followed by an object or a preposition is a verb ("cooked the eggs",
        # "lounged in the sun", "is speaking on"), unless a determiner precedes it ("a building on")
        takes_object = nxt is not None and (
            nxt in _DETERMINERS or nxt in _PREPOSITIONS or nxt in _PRONOUNS or _count_of(nxt) is not None
        )
        after_determiner = prev in _DETERMINERS or (prev is not None and _count_of(prev) is not None)
        if takes_object and not after_determiner:
            return True
        if not chunk and nxt is None:  # a trailing participle on its own ("... and marveling")
            return True
        if w.endswith("ing") and prev in {"and", "or", "while", "then"}:  # "... and making plans"
            return True
    return False


def _keep_chunk(chunk: list[str]) -> bool:
    """A chunk is a noun phrase unless it holds only function words or spatial nouns, or only
    participles without a determiner ("speaking" is dropped, "a painting" kept)."""
    content = [w for w in chunk if w.lower() not in _DETERMINERS | _PRONOUNS | _SPATIAL_NOUNS]
    if not content:
        return False
    has_determiner = any(w.lower() in _DETERMINERS for w in chunk)
    return has_determiner or not all(_verb_like(w) for w in content)


def _join(chunk: list[str]) -> str:
    return " ".join(chunk).replace(" ,", ",")


def noun_phrases(text: str, max_phrases: int | None = None) -> list[str]:
    """Noun phrases of a prompt, in order, with their determiners ("a green bench").

    Rules (a stand-in for spaCy's noun chunks, which T2I-CompBench uses): a leading "a photo of"
    is dropped; the words are split at
    - punctuation, except a comma after "determiner + one word" inside a phrase ("a long, narrow
      kitchen");
    - conjunctions, except "and" between two colours ("black and white cat");
    - prepositions and a list of common verbs ("is", "lay", "hold", ...);
    - -ed/-ing verbs: when followed by a determiner, number, pronoun or preposition and not
      preceded by a determiner or number ("cooked the eggs", "lounged in", but "a painting on"),
      and -ing words after "and" ("... and making plans").
    Pieces made only of determiners, pronouns or spatial nouns ("top", "the left"), or only of
    participles without a determiner ("speaking"), are dropped.

    >>> noun_phrases("The red apple was next to the oval plate.")
    ['The red apple', 'the oval plate']
    """
    words = _tokens(_PHOTO_PREFIX.sub("", text))
    phrases: list[str] = []
    chunk: list[str] = []
    for i, word in enumerate(words):
        if _is_boundary(words, i, chunk):
            if chunk and _keep_chunk(chunk):
                phrases.append(_join(chunk))
            chunk = []
        else:
            chunk.append(word)
    if chunk and _keep_chunk(chunk):
        phrases.append(_join(chunk))
    return phrases[:max_phrases] if max_phrases is not None else phrases


def object_name(phrase: str) -> str:
    """A noun phrase without its leading determiners and counts, lower-cased ("The red hat" -> "red hat")."""
    words = [w.lower() for w in _tokens(phrase) if w not in _PUNCT]
    while words and (words[0] in _DETERMINERS or _count_of(words[0]) is not None):
        words = words[1:]
    return " ".join(words)


def singular(name: str) -> str:
    """Singular of a (multi-word) object name: the last word, by a small rule set.

    Irregular plurals from a table ("people" -> "person", "mice" -> "mouse"); "-ies" -> "-y";
    "-sses"/"-xes"/"-ches"/"-shes" drop "es"; otherwise a final "s" is dropped unless the word
    ends in "ss", "us", "is" or "ous".
    """
    words = name.split()
    if not words:
        return name
    w = words[-1]
    lw = w.lower()
    if lw in _IRREGULAR_SINGULAR:
        w = _IRREGULAR_SINGULAR[lw]
    elif lw.endswith("ies") and len(lw) > 4:
        w = w[:-3] + "y"
    elif lw.endswith(("sses", "xes", "ches", "shes", "zzes")):
        w = w[:-2]
    elif lw.endswith("s") and not lw.endswith(_NOT_PLURAL_ENDINGS):
        w = w[:-1]
    return " ".join([*words[:-1], w])


def _plural_like(word: str) -> bool:
    w = word.lower()
    if w in _IRREGULAR_SINGULAR:
        return _IRREGULAR_SINGULAR[w] != w or w in {"sheep", "fish", "deer"}
    return w.endswith("s") and not w.endswith(_NOT_PLURAL_ENDINGS)


# ---------------------------------------------------------------------------- relations

# locality phrase -> canonical relation of obj1 to obj2 (T2I-CompBench / T2I-R1 wording and aliases)
LOCALITIES: dict[str, str] = {
    "on the left of": "left", "on the left side of": "left", "to the left of": "left", "left of": "left",
    "on the right of": "right", "on the right side of": "right", "to the right of": "right", "right of": "right",
    "on the top of": "above", "on top of": "above", "top of": "above", "above": "above",
    "on the bottom of": "below", "on bottom of": "below", "below": "below", "under": "below",
    "underneath": "below", "beneath": "below",
    "next to": "near", "near": "near", "on side of": "near", "on the side of": "near", "beside": "near",
}
RELATIONS = ("left", "right", "above", "below", "near")
_LOCALITY_RE = re.compile(
    r"\b(" + "|".join(re.escape(k) for k in sorted(LOCALITIES, key=len, reverse=True)) + r")\b", re.IGNORECASE
)


@dataclass(frozen=True)
class Relation:
    """`obj1` is `relation` of `obj2` (one of RELATIONS); names lower-cased, without determiners."""

    obj1: str
    relation: str
    obj2: str


def canonical_relation(locality: str) -> str | None:
    """T2I-R1 / T2I-CompBench locality wording -> one of RELATIONS, or None (e.g. "in front of")."""
    return LOCALITIES.get(" ".join(locality.lower().split()))


def parse_relation(prompt: str) -> Relation | None:
    """The first 2-D relation of a prompt: last noun phrase before the locality words, first after.

    "a bee on the right of a refrigerator" -> Relation("bee", "right", "refrigerator");
    "The red hat was on top of the brown coat rack." -> Relation("red hat", "above", "brown coat rack").
    None when no locality phrase of LOCALITIES occurs or a side has no noun phrase.
    """
    m = _LOCALITY_RE.search(prompt)
    if m is None:
        return None
    before, after = noun_phrases(prompt[: m.start()]), noun_phrases(prompt[m.end():])
    if not before or not after:
        return None
    obj1, obj2 = object_name(before[-1]), object_name(after[0])
    if not obj1 or not obj2:
        return None
    return Relation(obj1, LOCALITIES[m.group(1).lower()], obj2)


def parse_counts(prompt: str) -> list[tuple[str, int]]:
    """(singular object name, count) pairs of a numeracy prompt; [] when it names no number.

    Rules: a leading "a photo of" is ignored; a count is a number word (one..twelve) or digits,
    or "a"/"an" at the start of the prompt or after "," / "and" once the prompt has an explicit
    number ("two dogs and a cat"). The object is the run of words after the count up to a phrase
    boundary (at most 3 words): for counts > 1 up to the first plural-looking word ("three ice
    creams"), for 1 up to the first -ed/-ing/-ly/-s word after the first ("one traffic light").
    """
    words = _tokens(_PHOTO_PREFIX.sub("", prompt))
    if not any(_count_of(w) is not None for w in words):
        return []
    out: list[tuple[str, int]] = []
    for i, word in enumerate(words):
        n = _count_of(word)
        if n is None and word.lower() in _INDEFINITE and (i == 0 or words[i - 1].lower() in {",", "and"}):
            n = 1
        if n is None:
            continue
        run: list[str] = []
        for j in range(i + 1, min(len(words), i + 4)):
            w = words[j]
            if _count_of(w) is not None or w.lower() in _INDEFINITE or _is_boundary(words, j, run):
                break
            run.append(w)
        if not run:
            continue
        if n > 1:
            ends = [k for k, w in enumerate(run) if _plural_like(w)]
            taken = run[: ends[0] + 1] if ends else run[:1]
        else:
            taken = run[:1]
            for w in run[1:]:
                lw = w.lower()
                if _verb_like(w) or lw.endswith("ly") or (lw.endswith("s") and not lw.endswith(_NOT_PLURAL_ENDINGS)):
                    break
                taken.append(w)
        name = singular(object_name(" ".join(taken)))
        if name:
            out.append((name, n))
    return out


# ---------------------------------------------------------------------------- detection tasks


@dataclass(frozen=True)
class DetectionTask:
    """What the detector checks in one image.

    kind: "spatial" (`relation` between two objects), "numeracy" (`counts`), or "presence"
    (each of `nouns` detected). `nouns` lists every object name to detect.
    """

    kind: str
    nouns: tuple[str, ...]
    relation: Relation | None = None
    counts: tuple[tuple[str, int], ...] = ()


_TASK_ALIASES = {"spatial": "spatial", "2d_spatial": "spatial", "2d-spatial": "spatial", "numeracy": "numeracy"}


def _task_of(meta: dict) -> str | None:
    task = meta.get("task_type") or meta.get("category")
    return str(task).lower() if task else None


def _presence_nouns(prompt: str, meta: dict) -> tuple[str, ...]:
    nouns = meta.get("nouns")
    if nouns:
        return tuple(dict.fromkeys(str(n).lower() for n in nouns))
    return tuple(dict.fromkeys(n for n in (object_name(p) for p in noun_phrases(prompt)) if n))


def detection_task(prompt: str, meta: dict | None = None) -> DetectionTask:
    """The detection check for a prompt: from T2I-R1 metadata when present, else the prompt rules.

    The task is the metadata's `task_type`/`category` when given ("spatial" and "numeracy" are
    detection tasks; any other task is "presence"); without one, a prompt with a locality phrase is
    spatial and one with a number is numeracy. A spatial/numeracy prompt whose objects cannot be
    parsed (or whose locality is not 2-D, e.g. "in front of") falls back to presence of its nouns.
    """
    meta = meta or {}
    task = _task_of(meta)
    kind = _TASK_ALIASES.get(task or "", "presence" if task else None)
    if kind in (None, "spatial"):
        info = meta.get("spatial_info")
        rel = None
        if info:
            relation = canonical_relation(str(info.get("locality", "")))
            if relation is not None:
                rel = Relation(str(info["obj1"]).lower(), relation, str(info["obj2"]).lower())
        else:
            rel = parse_relation(prompt)
        if rel is not None:
            return DetectionTask("spatial", tuple(dict.fromkeys([rel.obj1, rel.obj2])), relation=rel)
    if kind in (None, "numeracy"):
        info = meta.get("numeracy_info")
        counts = [(str(c["obj_name"]).lower(), int(c["num"])) for c in info] if info else parse_counts(prompt)
        if counts:
            return DetectionTask("numeracy", tuple(dict.fromkeys(n for n, _ in counts)), counts=tuple(counts))
    return DetectionTask("presence", _presence_nouns(prompt, meta))


# ============================================================================ box geometry


def box_iou(a: Tensor, b: Tensor) -> Tensor:
    """IoU of xyxy boxes a [N, 4] and b [M, 4] -> [N, M]."""
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)  # [N]
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)  # [M]
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])  # [N, M, 2]
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])  # [N, M, 2]
    inter = (rb - lt).clamp(min=0).prod(-1)  # [N, M]
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(inter))


def nms(boxes: Tensor, scores: Tensor, iou_threshold: float) -> Tensor:
    """Greedy non-maximum suppression (as torchvision.ops.nms): indices kept, by decreasing score."""
    order = torch.argsort(scores, descending=True, stable=True)
    keep: list[int] = []
    suppressed = torch.zeros(len(order), dtype=torch.bool)
    iou = box_iou(boxes[order], boxes[order]) if len(order) else torch.zeros(0, 0)
    for i in range(len(order)):
        if suppressed[i]:
            continue
        keep.append(int(order[i]))
        suppressed |= iou[i] > iou_threshold
    return torch.tensor(keep, dtype=torch.long)


def relation_score(
    relation: str, box1: Sequence[float], box2: Sequence[float], iou_threshold: float = 0.1, near_threshold: float = 0.3
) -> float:
    """Soft score in [0, 1] that xyxy box1 (obj1) stands in `relation` to box2 (obj2).

    The rule of T2I-CompBench's `determine_position` (also T2I-R1's), image y pointing down,
    dx = centre2.x - centre1.x, dy = centre2.y - centre1.y:
    - left: dx > 0 and |dx| > |dy|; right: dx < 0 and |dx| > |dy|;
      above: dy > 0 and |dy| > |dx|; below: dy < 0 and |dy| > |dx|;
      each scores 1 if IoU < iou_threshold, else iou_threshold / IoU, and 0 if the direction is wrong;
    - near: 1 if |dx| < near_threshold or |dy| < near_threshold, else near_threshold / max(|dx|, |dy|).
    Coordinates are whatever the boxes use: Grounding DINO's are normalised to [0, 1], where the
    default near_threshold 0.3 is T2I-CompBench's 150 px on a 512-px image.
    """
    if relation not in RELATIONS:
        raise ValueError(f"Unknown relation: {relation!r}; expected one of {RELATIONS}")
    (x0, y0, x1, y1), (u0, v0, u1, v1) = [float(v) for v in box1], [float(v) for v in box2]
    dx = (u0 + u1) / 2 - (x0 + x1) / 2
    dy = (v0 + v1) / 2 - (y0 + y1) / 2
    if relation == "near":
        if abs(dx) < near_threshold or abs(dy) < near_threshold:
            return 1.0
        return near_threshold / max(abs(dx), abs(dy))
    inter = max(0.0, min(x1, u1) - max(x0, u0)) * max(0.0, min(y1, v1) - max(y0, v0))
    union = (x1 - x0) * (y1 - y0) + (u1 - u0) * (v1 - v0) - inter
    iou = inter / union if union > 0 else 0.0
    horizontal, vertical = abs(dx) > abs(dy), abs(dy) > abs(dx)
    correct = {"left": dx > 0 and horizontal, "right": dx < 0 and horizontal,
               "above": dy > 0 and vertical, "below": dy < 0 and vertical}[relation]
    if not correct:
        return 0.0
    return 1.0 if iou < iou_threshold else iou_threshold / iou


# ============================================================================ detection scores


@dataclass
class Detections:
    """Boxes of one phrase in one image: xyxy normalised to [0, 1] [n, 4], phrase scores [n] (descending)."""

    boxes: Tensor = field(default_factory=lambda: torch.zeros(0, 4))
    scores: Tensor = field(default_factory=lambda: torch.zeros(0))

    def __len__(self) -> int:
        return int(self.scores.numel())

    def best(self) -> tuple[Tensor, float] | None:
        """(box [4], score) of the most confident detection, or None."""
        if not len(self):
            return None
        i = int(torch.argmax(self.scores))
        return self.boxes[i], float(self.scores[i])


def count_boxes(det: Detections, iou_threshold: float = 0.5) -> int:
    """Objects detected after non-maximum suppression (duplicates of one object merged)."""
    return int(nms(det.boxes, det.scores, iou_threshold).numel()) if len(det) else 0


def t2i_r1_spatial_score(
    dets: dict[str, Detections], rel: Relation, iou_threshold: float = 0.1, near_threshold: float = 0.3
) -> float:
    """T2I-R1: 0.2 per object detected; with both, + relation_score(best boxes) / 2 (max 0.9)."""
    d1, d2 = dets.get(rel.obj1, Detections()), dets.get(rel.obj2, Detections())
    score = 0.2 * (len(d1) > 0) + 0.2 * (len(d2) > 0)
    if len(d1) and len(d2):
        score += relation_score(rel.relation, d1.best()[0], d2.best()[0], iou_threshold, near_threshold) / 2
    return score


def count_match_score(dets: dict[str, Detections], counts: Sequence[tuple[str, int]], nms_iou: float, wrong: float) -> float:
    """Mean over the asked (name, count) of 1 if the NMS count is right, `wrong` if detected with another
    count, 0 if absent. The shared form of T2I-R1's reward and T2I-CompBench's numeracy metric."""
    total = 0.0
    for name, expected in counts:
        det = dets.get(name, Detections())
        if len(det):
            total += 1.0 if count_boxes(det, nms_iou) == expected else wrong
    return total / len(counts)


def t2i_r1_numeracy_score(dets: dict[str, Detections], counts: Sequence[tuple[str, int]], nms_iou: float = 0.5) -> float:
    """T2I-R1: mean over objects of 1 if the NMS count equals the asked number, 0.2 if wrong, 0 if absent."""
    return count_match_score(dets, counts, nms_iou, wrong=0.2) if counts else 1.0


def t2i_r1_presence_score(dets: dict[str, Detections], nouns: Sequence[str]) -> float:
    """T2I-R1: fraction of the nouns detected at least once (1 for a prompt without nouns)."""
    if not nouns:
        return 1.0
    return sum(len(dets.get(n, Detections())) > 0 for n in nouns) / len(nouns)


# ============================================================================ CLIP family (transformers)


class _HFClip:
    """A transformers CLIPModel + processor: unit image and text embeddings, batched."""

    def __init__(self, reward: str, path, processor_path, source: str, processor_source: str, device, batch_size: int):
        _prepare_transformers()
        from transformers import AutoProcessor, CLIPModel

        model_dir, proc_dir = _model_and_processor(path, processor_path, reward, source, processor_source)
        self.device = torch.device(device)
        self.batch_size = _check_batch_size(batch_size)
        self.model = CLIPModel.from_pretrained(model_dir, local_files_only=True).eval().to(self.device)
        self.processor = AutoProcessor.from_pretrained(proc_dir, local_files_only=True)
        self.max_length = _text_max_length(self.processor.tokenizer, self.model.config.text_config.max_position_embeddings)

    def image_embeds(self, pil_images: list) -> Tensor:
        pixels = self.processor(images=pil_images, return_tensors="pt")["pixel_values"].to(self.device)
        return F.normalize(self.model.get_image_features(pixel_values=pixels).float(), dim=-1)  # [b, E]

    def text_embeds(self, prompts: list[str]) -> Tensor:
        tok = self.processor.tokenizer(
            prompts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        feats = self.model.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"])
        return F.normalize(feats.float(), dim=-1)  # [b, E]

    @torch.no_grad()
    def cosine(self, images: Tensor, prompts: list[str]) -> Tensor:
        """cos(image_i, prompt_i) for each pair: [B] float32 on the CPU."""
        pil = _to_pil(images)
        out = []
        for s in _chunks(len(pil), self.batch_size):
            out.append((self.image_embeds(pil[s]) * self.text_embeds(list(prompts[s]))).sum(-1).cpu())
        return torch.cat(out)


class PickScoreReward:
    """PickScore: exp(logit_scale) * cos(image, prompt) of the PickScore_v1 CLIP, not rescaled (about 18-24).

    `path`: the model folder (yuvalkirstain/PickScore_v1); `processor_path`: the processor folder
    (laion/CLIP-ViT-H-14-laion2B-s32B-b79K), default `path`.
    """

    def __init__(self, path: str, processor_path: str | None = None, device: str = "cpu", batch_size: int = 16):
        self.clip = _HFClip("pickscore", path, processor_path, "https://huggingface.co/yuvalkirstain/PickScore_v1",
                            "https://huggingface.co/laion/CLIP-ViT-H-14-laion2B-s32B-b79K", device, batch_size)
        self.scale = float(self.clip.model.logit_scale.detach().exp())

    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        _check_batch(images, prompts, metadata)
        return (self.scale * self.clip.cosine(images, prompts)).to(torch.float32)  # [B]


CLIP_SCORE_FORMS = ("cosine", "clipscore_100")


class ClipScoreReward:
    """CLIP image-text similarity.

    form "cosine" (default): the raw cosine, as T2I-CompBench's non-spatial metric (CLIP ViT-B/32);
    form "clipscore_100": 100 * max(cos, 0) (the torchmetrics CLIPScore convention).
    """

    def __init__(self, path: str, processor_path: str | None = None, form: str = "cosine", device: str = "cpu",
                 batch_size: int = 32):
        if form not in CLIP_SCORE_FORMS:
            raise ValueError(f"Unknown form: {form!r}; expected one of {CLIP_SCORE_FORMS}")
        self.form = form
        self.clip = _HFClip("clipscore", path, processor_path, "https://huggingface.co/openai/clip-vit-base-patch32",
                            "https://huggingface.co/openai/clip-vit-base-patch32", device, batch_size)

    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        _check_batch(images, prompts, metadata)
        cos = self.clip.cosine(images, prompts)
        return (cos if self.form == "cosine" else 100.0 * cos.clamp(min=0)).to(torch.float32)


class AestheticMLP(nn.Module):
    """The improved-aesthetic-predictor head (christophschuhmann/improved-aesthetic-predictor).

    Linear(d, 1024) - Dropout(0.2) - Linear(1024, 128) - Dropout(0.2) - Linear(128, 64) -
    Dropout(0.1) - Linear(64, 16) - Linear(16, 1), no activations, in `layers` (state-dict keys
    layers.{0,2,4,6,7}.{weight,bias}); d = 768 for CLIP ViT-L/14.
    """

    HIDDEN = (1024, 128, 64, 16)

    def __init__(self, input_size: int = 768):
        super().__init__()
        h1, h2, h3, h4 = self.HIDDEN
        self.input_size = input_size
        self.layers = nn.Sequential(
            nn.Linear(input_size, h1), nn.Dropout(0.2), nn.Linear(h1, h2), nn.Dropout(0.2),
            nn.Linear(h2, h3), nn.Dropout(0.1), nn.Linear(h3, h4), nn.Linear(h4, 1),
        )

    def forward(self, embeds: Tensor) -> Tensor:
        return self.layers(embeds)  # [B, 1]

    @classmethod
    def load(cls, path: str | Path) -> AestheticMLP:
        """From a .pth/.pt (torch.load weights_only) or .safetensors state dict; strict keys."""
        p = Path(path)
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(p))
        else:
            state = torch.load(p, map_location="cpu", weights_only=True)
            state = state.get("state_dict", state)
        if "layers.0.weight" not in state:
            raise ValueError(f"aesthetic: {p} is not an improved-aesthetic-predictor state dict "
                             f"(no 'layers.0.weight'; keys: {sorted(state)[:6]}...)")
        mlp = cls(int(state["layers.0.weight"].shape[1]))
        mlp.load_state_dict(state, strict=True)
        return mlp.eval()


class AestheticReward:
    """LAION aesthetic score: the MLP on the L2-normalised CLIP ViT-L/14 image embedding (about 1-10).

    `path`: the MLP weights (sac+logos+ava1-l14-linearMSE.pth); `clip_path`: the CLIP folder
    (openai/clip-vit-large-patch14) holding model and image-processor files.
    """

    def __init__(self, path: str, clip_path: str, device: str = "cpu", batch_size: int = 32):
        _prepare_transformers()
        from transformers import AutoConfig, AutoImageProcessor, CLIPVisionModelWithProjection

        mlp_file = _require_file(path, "aesthetic", "path", "the improved-aesthetic-predictor MLP weights "
                                 "(sac+logos+ava1-l14-linearMSE.pth or .safetensors)",
                                 "https://github.com/christophschuhmann/improved-aesthetic-predictor")
        clip_dir = _require_pretrained(clip_path, "aesthetic", "clip_path", "https://huggingface.co/openai/clip-vit-large-patch14")
        if not (clip_dir / "preprocessor_config.json").is_file():
            raise FileNotFoundError(f"aesthetic: {clip_dir}/preprocessor_config.json not found (the CLIP image "
                                    "processor); download openai/clip-vit-large-patch14 completely")
        self.device = torch.device(device)
        self.batch_size = _check_batch_size(batch_size)
        config = AutoConfig.from_pretrained(clip_dir, local_files_only=True)
        vision_config = getattr(config, "vision_config", config)
        # a full CLIP checkpoint keeps projection_dim at the top level; the vision tower needs it
        vision_config.projection_dim = getattr(config, "projection_dim", vision_config.projection_dim)
        self.vision = CLIPVisionModelWithProjection.from_pretrained(
            clip_dir, config=vision_config, local_files_only=True
        ).eval().to(self.device)
        self.image_processor = AutoImageProcessor.from_pretrained(clip_dir, local_files_only=True)
        self.mlp = AestheticMLP.load(mlp_file).to(self.device)
        if self.mlp.input_size != self.vision.config.projection_dim:
            raise ValueError(f"aesthetic: the MLP takes {self.mlp.input_size}-d embeddings but the CLIP at "
                             f"{clip_dir} projects to {self.vision.config.projection_dim}")

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        _check_batch(images, prompts, metadata)
        pil = _to_pil(images)
        out = []
        for s in _chunks(len(pil), self.batch_size):
            pixels = self.image_processor(images=pil[s], return_tensors="pt")["pixel_values"].to(self.device)
            embeds = F.normalize(self.vision(pixel_values=pixels).image_embeds.float(), dim=-1)  # [b, 768]
            out.append(self.mlp(embeds).squeeze(-1).cpu())  # [b]
        return torch.cat(out).to(torch.float32)


# ============================================================================ VQA (BLIP, GIT)

VQA_REDUCTIONS = ("product", "mean")


def vqa_phrases(prompt: str, meta: dict | None = None, max_phrases: int = 8) -> list[str]:
    """The phrases asked about: metadata `attr_nouns` or `nouns` (T2I-R1) when given, else noun_phrases."""
    meta = meta or {}
    for key in ("attr_nouns", "nouns"):
        if meta.get(key):
            return [str(p) for p in meta[key]][:max_phrases]
    return noun_phrases(prompt, max_phrases)


class _PhraseVQA:
    """Yes-probability of "{phrase}?" for every noun phrase of the prompt, reduced per image.

    Subclasses implement `_yes_probability(images, owners, questions)`.
    """

    reward = "vqa"

    def __init__(self, reduce: str, skip_tasks: Sequence[str], max_phrases: int, device, batch_size: int):
        if reduce not in VQA_REDUCTIONS:
            raise ValueError(f"Unknown reduce: {reduce!r}; expected one of {VQA_REDUCTIONS}")
        if max_phrases < 1:
            raise ValueError(f"max_phrases={max_phrases} must be >= 1")
        self.reduce = reduce
        self.skip_tasks = {str(t).lower() for t in skip_tasks}
        self.max_phrases = int(max_phrases)
        self.device = torch.device(device)
        self.batch_size = _check_batch_size(batch_size)

    def _token_id(self, tokenizer, word: str) -> int:
        token_id = tokenizer.convert_tokens_to_ids(word)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"{self.reward}: the tokenizer has no token {word!r}; is this a VQA model's tokenizer?")
        return int(token_id)

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        metadata = _check_batch(images, prompts, metadata)
        owners, questions = [], []
        skipped = []
        for i, (prompt, meta) in enumerate(zip(prompts, metadata)):
            if _task_of(meta) in self.skip_tasks:
                skipped.append(i)
                continue
            for phrase in vqa_phrases(prompt, meta, self.max_phrases):
                owners.append(i)
                questions.append(f"{phrase}?")
        asked = sorted(set(owners))  # only images with a question go through the model
        local = {i: k for k, i in enumerate(asked)}
        probs = torch.zeros(0)
        if questions:
            probs = self._yes_probability(_to_pil(images[asked]), [local[o] for o in owners], questions)
        scores = []
        for i in range(len(prompts)):
            p = probs[[k for k, o in enumerate(owners) if o == i]]
            if i in skipped:
                scores.append(0.0)  # T2I-R1: no VQA reward for these tasks
            elif p.numel() == 0:
                scores.append(1.0)  # nothing to ask (T2I-CompBench counts an empty question as 1)
            else:
                scores.append(float(p.prod() if self.reduce == "product" else p.mean()))
        return torch.tensor(scores, dtype=torch.float32)


class BlipVQAReward(_PhraseVQA):
    """BLIP-VQA attribute binding, as T2I-CompBench scores color/shape/texture.

    For every noun phrase ("a green bench") the question "a green bench?" is answered; the
    probability of "yes" is p_yes / (p_yes + p_no) of the decoder's first answer token after
    [DEC] (T2I-CompBench's `vqa_prob`); the image scores the product over phrases (`reduce`).
    `path`: a BlipForQuestionAnswering folder (Salesforce/blip-vqa-capfilt-large is T2I-CompBench's
    model; blip-vqa-base also works); `processor_path` defaults to `path`.
    """

    reward = "vqa"

    def __init__(self, path: str, processor_path: str | None = None, reduce: str = "product",
                 skip_tasks: Sequence[str] = (), max_phrases: int = 8, device: str = "cpu", batch_size: int = 16):
        super().__init__(reduce, skip_tasks, max_phrases, device, batch_size)
        _prepare_transformers()
        from transformers import AutoProcessor, BlipForQuestionAnswering

        source = "https://huggingface.co/Salesforce/blip-vqa-capfilt-large"
        model_dir, proc_dir = _model_and_processor(path, processor_path, self.reward, source)
        self.model = BlipForQuestionAnswering.from_pretrained(model_dir, local_files_only=True).eval().to(self.device)
        self.processor = AutoProcessor.from_pretrained(proc_dir, local_files_only=True)
        self.yes_id = self._token_id(self.processor.tokenizer, "yes")
        self.no_id = self._token_id(self.processor.tokenizer, "no")

    def _yes_probability(self, pil: list, owners: list[int], questions: list[str]) -> Tensor:
        m = self.model
        image_embeds = []
        for s in _chunks(len(pil), self.batch_size):
            pixels = self.processor.image_processor(images=pil[s], return_tensors="pt")["pixel_values"].to(self.device)
            image_embeds.append(m.vision_model(pixel_values=pixels)[0])  # [b, N, D]
        image_embeds = torch.cat(image_embeds)  # [B, N, D]
        # Questions are batched by token length, never padded: transformers' BLIP text decoder
        # (4.55) drops the encoder attention mask in its cross-attention, so padding would leak
        # into the answer; equal lengths give the unpadded result of the original BLIP code.
        ids = self.processor.tokenizer(questions)["input_ids"]
        by_length: dict[int, list[int]] = {}
        for k, row in enumerate(ids):
            by_length.setdefault(len(row), []).append(k)
        out = torch.zeros(len(questions))
        for members in by_length.values():
            for s in _chunks(len(members), self.batch_size):
                rows = members[s]
                input_ids = torch.tensor([ids[k] for k in rows], device=self.device)  # [q, L]
                img = image_embeds[torch.tensor([owners[k] for k in rows], device=self.device)]  # [q, N, D]
                img_mask = torch.ones(img.shape[:-1], dtype=torch.long, device=self.device)
                q_states = m.text_encoder(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                          encoder_hidden_states=img, encoder_attention_mask=img_mask,
                                          return_dict=True)[0]  # [q, L, D]
                bos = torch.full((len(rows), 1), m.decoder_start_token_id, dtype=torch.long, device=self.device)
                logits = m.text_decoder(input_ids=bos, encoder_hidden_states=q_states,
                                        encoder_attention_mask=torch.ones_like(input_ids), return_dict=True).logits[:, 0]
                prob = logits.float().softmax(-1)  # [q, V]
                out[rows] = (prob[:, self.yes_id] / (prob[:, self.yes_id] + prob[:, self.no_id])).cpu()
        return out


class GitVQAReward(_PhraseVQA):
    """GIT VQA (T2I-R1's "git" reward, used by the MAR-GRPO paper's mixed reward).

    Input [CLS] + "{phrase}?" (no [SEP]); the next-token distribution gives P(yes) =
    p_yes / (p_yes + p_no); the image scores the mean over phrases (T2I-R1), with phrases from
    metadata `attr_nouns`/`nouns` or the prompt rules. Prompts whose task is in `skip_tasks`
    (T2I-R1: spatial, numeracy, left to the detector) score 0.
    `path`: a GitForCausalLM folder (microsoft/git-large-vqav2); `processor_path` defaults to `path`.
    """

    reward = "git_vqa"

    def __init__(self, path: str, processor_path: str | None = None, reduce: str = "mean",
                 skip_tasks: Sequence[str] = ("spatial", "numeracy"), max_phrases: int = 8, device: str = "cpu",
                 batch_size: int = 16):
        super().__init__(reduce, skip_tasks, max_phrases, device, batch_size)
        _prepare_transformers()
        from transformers import AutoModelForCausalLM, AutoProcessor

        source = "https://huggingface.co/microsoft/git-large-vqav2"
        model_dir, proc_dir = _model_and_processor(path, processor_path, self.reward, source)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval().to(self.device)
        if type(self.model).__name__ != "GitForCausalLM":
            raise ValueError(f"git_vqa: {model_dir} holds a {type(self.model).__name__}, expected GitForCausalLM")
        self.processor = AutoProcessor.from_pretrained(proc_dir, local_files_only=True)
        tok = self.processor.tokenizer
        self.yes_id, self.no_id = self._token_id(tok, "yes"), self._token_id(tok, "no")
        self.cls_id, self.pad_id = tok.cls_token_id, tok.pad_token_id or 0

    def _yes_probability(self, pil: list, owners: list[int], questions: list[str]) -> Tensor:
        tok = self.processor.tokenizer
        pixels = torch.cat([self.processor.image_processor(images=pil[s], return_tensors="pt")["pixel_values"]
                            for s in _chunks(len(pil), self.batch_size)])  # [B, 3, h, w]
        ids = [[self.cls_id, *tok(q, add_special_tokens=False)["input_ids"]] for q in questions]
        out = []
        for s in _chunks(len(questions), self.batch_size):
            rows = ids[s]
            length = max(len(r) for r in rows)
            input_ids = torch.tensor([r + [self.pad_id] * (length - len(r)) for r in rows], device=self.device)
            mask = torch.tensor([[1] * len(r) + [0] * (length - len(r)) for r in rows], device=self.device)
            pv = pixels[torch.tensor(owners[s])].to(self.device)
            logits = self.model(pixel_values=pv, input_ids=input_ids, attention_mask=mask).logits  # [q, N_img + L, V]
            last = logits.shape[1] - length + torch.tensor([len(r) - 1 for r in rows], device=self.device)  # [q]
            prob = logits[torch.arange(len(rows), device=self.device), last].float().softmax(-1)  # [q, V]
            out.append((prob[:, self.yes_id] / (prob[:, self.yes_id] + prob[:, self.no_id])).cpu())
        return torch.cat(out)


# ============================================================================ Grounding DINO


class GroundingDinoReward:
    """Open-vocabulary detection reward (T2I-R1's "gdino", used by the MAR-GRPO paper's mixed reward).

    Per prompt a DetectionTask (`detection_task`: T2I-R1 metadata or the prompt rules) names the
    objects; the text query is "name1 . name2 ." and a query box counts for a name when the mean
    sigmoid logit over the name's tokens exceeds `box_threshold` (T2I-R1's token-span scores).
    - spatial: 0.2 per object detected, + relation_score(most confident boxes) / 2 (max 0.9);
    - numeracy: mean over objects of 1 (count after NMS at `nms_iou` == asked), 0.2 (detected,
      wrong count) or 0 (absent);
    - presence (every other prompt, and spatial/numeracy prompts that cannot be parsed): fraction
      of the nouns detected; 1 for a prompt with no nouns.
    One deviation from T2I-R1's code: there "above" and "on top of" score no relation (the names
    are missing from its rule); here they are scored like "on the top of".
    `path`: a Grounding DINO folder (IDEA-Research/grounding-dino-base); `processor_path` defaults
    to `path`.
    """

    def __init__(self, path: str, processor_path: str | None = None, box_threshold: float = 0.3,
                 nms_iou: float = 0.5, iou_threshold: float = 0.1, near_threshold: float = 0.3,
                 device: str = "cpu", batch_size: int = 8):
        _prepare_transformers()
        from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

        source = "https://huggingface.co/IDEA-Research/grounding-dino-base"
        model_dir, proc_dir = _model_and_processor(path, processor_path, "grounding_dino", source)
        self.device = torch.device(device)
        self.batch_size = _check_batch_size(batch_size)
        self.box_threshold, self.nms_iou = float(box_threshold), float(nms_iou)
        self.iou_threshold, self.near_threshold = float(iou_threshold), float(near_threshold)
        self.model = AutoModelForZeroShotObjectDetection.from_pretrained(model_dir, local_files_only=True).eval().to(self.device)
        self.processor = AutoProcessor.from_pretrained(proc_dir, local_files_only=True)

    @staticmethod
    def query(names: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
        """Grounding DINO text "a . b ." for the names, and each name's character span in it."""
        spans, parts, pos = [], [], 0
        for name in names:
            spans.append((pos, pos + len(name)))
            parts.append(name)
            pos += len(name) + 3  # " . "
        return " . ".join(parts) + " .", spans

    @torch.no_grad()
    def detect(self, images: Tensor, names: Sequence[Sequence[str]]) -> list[dict[str, Detections]]:
        """For each image, {name: Detections} of its names (boxes above box_threshold, best first)."""
        pil = _to_pil(images)
        results: list[dict[str, Detections]] = [{} for _ in pil]
        todo = [i for i, n in enumerate(names) if n]
        for s in _chunks(len(todo), self.batch_size):
            idx = todo[s]
            queries = [self.query([n.lower() for n in names[i]]) for i in idx]
            texts = [q for q, _ in queries]
            inputs = self.processor(images=[pil[i] for i in idx], text=texts, padding="longest",
                                    return_tensors="pt").to(self.device)
            out = self.model(**inputs)
            probs = out.logits.float().sigmoid()  # [b, Q, max_text_len]
            boxes = out.pred_boxes.float()  # [b, Q, 4] cx, cy, w, h in [0, 1]
            xyxy = torch.cat([boxes[..., :2] - boxes[..., 2:] / 2, boxes[..., :2] + boxes[..., 2:] / 2], -1)
            offsets = self.processor.tokenizer(texts, return_offsets_mapping=True, padding="longest")["offset_mapping"]
            for b, i in enumerate(idx):
                for name, (start, end) in zip(names[i], queries[b][1]):
                    tokens = [t for t, (a, z) in enumerate(offsets[b]) if z > a and a >= start and z <= end]
                    tokens = [t for t in tokens if t < probs.shape[-1]]
                    if not tokens:
                        results[i][name] = Detections()
                        continue
                    phrase = probs[b][:, tokens].mean(-1)  # [Q]
                    keep = phrase > self.box_threshold
                    order = torch.argsort(phrase[keep], descending=True)
                    results[i][name] = Detections(xyxy[b][keep][order].cpu(), phrase[keep][order].cpu())
        return results

    def score_task(self, task: DetectionTask, dets: dict[str, Detections]) -> float:
        """The T2I-R1 score of one image's detections for its task."""
        if task.kind == "spatial":
            return t2i_r1_spatial_score(dets, task.relation, self.iou_threshold, self.near_threshold)
        if task.kind == "numeracy":
            return t2i_r1_numeracy_score(dets, task.counts, self.nms_iou)
        return t2i_r1_presence_score(dets, task.nouns)

    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        metadata = _check_batch(images, prompts, metadata)
        tasks = [detection_task(p, m) for p, m in zip(prompts, metadata)]
        dets = self.detect(images, [t.nouns for t in tasks])
        return torch.tensor([self.score_task(t, d) for t, d in zip(tasks, dets)], dtype=torch.float32)


# ============================================================================ evaluator-stack models


def _load_open_clip_config(clip_path: str | Path, model_name: str) -> dict:
    """An open_clip architecture config: a JSON file, or a folder holding `{model_name}.json` or
    `open_clip_config.json` (the Hugging Face layout, whose "model_cfg" is used)."""
    import json

    p = Path(clip_path).expanduser()
    candidates = [p] if p.is_file() else [p / f"{model_name}.json", p / "open_clip_config.json"]
    for c in candidates:
        if c.is_file():
            cfg = json.loads(c.read_text())
            cfg = cfg.get("model_cfg", cfg)
            if not all(k in cfg for k in ("embed_dim", "vision_cfg", "text_cfg")):
                raise ValueError(f"hpsv2: {c} is not an open_clip model config (needs embed_dim, vision_cfg, text_cfg)")
            return cfg
    raise FileNotFoundError(
        f"hpsv2: {p} not found (expected an open_clip model config: a JSON file, or a folder with "
        f"{model_name}.json or open_clip_config.json, e.g. laion/CLIP-ViT-H-14-laion2B-s32B-b79K); "
        f"point reward_models.hpsv2.clip_path at it, or leave it out to use hpsv2's bundled {model_name} config"
    )


class HPSv2Reward:
    """HPS v2.1: cos(image, prompt) of the HPS-fine-tuned open_clip ViT-H-14 (hpsv2's `score`; about 0.2-0.35).

    The model is built by hpsv2's own open_clip with pretrained=None (no download) and loaded
    strictly from `path` (HPS_v2.1_compressed.pt, {"state_dict": ...}, torch.load weights_only);
    the tokenizer is hpsv2's bundled BPE. The architecture is hpsv2's bundled `model_name` config,
    or the open_clip config at `clip_path` when given (the HPS checkpoint holds every weight, so no
    base CLIP weights are read). Preprocessing: hpsv2's evaluation transform (resize the longer
    side, pad, normalise).
    """

    def __init__(self, path: str, clip_path: str | None = None, model_name: str = "ViT-H-14",
                 device: str = "cpu", batch_size: int = 16):
        ckpt = _require_file(path, "hpsv2", "path", "the HPS v2.1 checkpoint HPS_v2.1_compressed.pt",
                             "https://huggingface.co/xswu/HPSv2")
        cfg = _load_open_clip_config(clip_path, model_name) if clip_path is not None else None
        _import_evaluator_package("hpsv2", "hpsv2.src.open_clip", "hpsv2")
        from hpsv2.src.open_clip import create_model_and_transforms, factory, get_tokenizer

        if cfg is not None:
            # hpsv2's open_clip looks architectures up by name in this registry (filled from JSON files)
            factory._MODEL_CONFIGS[model_name] = cfg
        elif factory.get_model_config(model_name) is None:
            raise ValueError(f"hpsv2: unknown model_name {model_name!r}; give clip_path (an open_clip config)")
        self.device = torch.device(device)
        self.batch_size = _check_batch_size(batch_size)
        self.model, _, self.preprocess = create_model_and_transforms(
            model_name, pretrained=None, precision="fp32", device=self.device, jit=False,
            force_quick_gelu=False, force_custom_text=False, force_patch_dropout=False, force_image_size=None,
            pretrained_image=False, image_mean=None, image_std=None, light_augmentation=True, aug_cfg={},
            output_dict=True, with_score_predictor=False, with_region_predictor=False,
        )
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        state = state.get("state_dict", state)
        if next(iter(state)).startswith("module."):
            state = {k[len("module."):]: v for k, v in state.items()}
        self.model.load_state_dict(state, strict=True)
        self.model.eval()
        self.tokenizer = get_tokenizer(model_name)

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        _check_batch(images, prompts, metadata)
        pil = _to_pil(images)
        out = []
        for s in _chunks(len(pil), self.batch_size):
            pixels = torch.stack([self.preprocess(im) for im in pil[s]]).to(self.device)
            text = self.tokenizer(list(prompts[s])).to(self.device)
            img = self.model.encode_image(pixels, normalize=True).float()
            txt = self.model.encode_text(text, normalize=True).float()
            out.append((img * txt).sum(-1).cpu())
        return torch.cat(out).to(torch.float32)


@contextmanager
def _bert_base_uncased_from(folder: str | None):
    """While loading ImageReward, answer its BLIP's hub-name request for 'bert-base-uncased' from `folder`."""
    if folder is None:
        yield
        return
    import ImageReward.models.BLIP.blip as blip

    original = blip.BertTokenizer

    class LocalBertTokenizer(original):
        @classmethod
        def from_pretrained(cls, name, *args, **kwargs):
            return original.from_pretrained(str(folder) if name == "bert-base-uncased" else name, *args, **kwargs)

    blip.BertTokenizer = LocalBertTokenizer
    try:
        yield
    finally:
        blip.BertTokenizer = original


class ImageRewardReward:
    """ImageReward-v1.0: (MLP(BLIP [CLS] of the prompt cross-attending the image) - mean) / std.

    Loaded with the package's own `ImageReward.load(path, device, med_config=...)` from local
    files (ImageReward.pt and med_config.json of THUDM/ImageReward). The package's BLIP asks for
    the `bert-base-uncased` tokenizer by hub name: `tokenizer_path` (a local folder with its
    vocab.txt) answers that request, for compute nodes with no hub cache; without it the Hugging
    Face cache must hold the tokenizer. Scoring is batched through the model's `score_gard`
    (prompt tokens padded to 35, as `score`).
    """

    def __init__(self, path: str, med_config: str, device: str = "cpu", batch_size: int = 16,
                 tokenizer_path: str | None = None):
        source = "https://huggingface.co/THUDM/ImageReward"
        ckpt = _require_file(path, "imagereward", "path", "the ImageReward checkpoint ImageReward.pt", source)
        med = _require_file(med_config, "imagereward", "med_config", "the BLIP text config med_config.json", source)
        if tokenizer_path is not None:
            _require_file(Path(tokenizer_path) / "vocab.txt", "imagereward", "tokenizer_path",
                          "the vocab.txt of a bert-base-uncased tokenizer folder", "https://huggingface.co/bert-base-uncased")
        _import_evaluator_package("imagereward", "ImageReward", "image-reward")
        import ImageReward as RM

        self.device = torch.device(device)
        self.batch_size = _check_batch_size(batch_size)
        with _bert_base_uncased_from(tokenizer_path):
            self.model = RM.load(str(ckpt), device=str(self.device), med_config=str(med)).eval()

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        _check_batch(images, prompts, metadata)
        pil = _to_pil(images)
        out = []
        for s in _chunks(len(pil), self.batch_size):
            pixels = torch.stack([self.model.preprocess(im) for im in pil[s]]).to(self.device)
            text = self.model.blip.tokenizer(list(prompts[s]), padding="max_length", truncation=True, max_length=35,
                                             return_tensors="pt").to(self.device)
            rewards = self.model.score_gard(text.input_ids, text.attention_mask, pixels)  # [b, 1]
            out.append(rewards.float().squeeze(-1).cpu())
        return torch.cat(out).to(torch.float32)


# ============================================================================ registry


# Each class takes its options (local paths, device, batch_size) as keywords: the class is the factory.
for _name, _scorer in {
    "pickscore": PickScoreReward,  # PickScore_v1 (`path`) with its CLIP-H processor (`processor_path`)
    "clipscore": ClipScoreReward,  # CLIP cosine (`form="cosine"`) or 100 * max(cos, 0) (`form="clipscore_100"`)
    "aesthetic": AestheticReward,  # LAION improved-aesthetic MLP (`path`) on CLIP ViT-L/14 (`clip_path`)
    "vqa": BlipVQAReward,  # BLIP-VQA: product over noun phrases of P(yes) (T2I-CompBench)
    "git_vqa": GitVQAReward,  # GIT VQA: mean over (attribute) nouns of P(yes) (T2I-R1)
    "grounding_dino": GroundingDinoReward,  # relation / count / presence reward (T2I-R1)
    "hpsv2": HPSv2Reward,  # HPS v2.1 (needs the evaluator stack: hpsv2)
    "imagereward": ImageRewardReward,  # ImageReward-v1.0 (needs the evaluator stack: image-reward)
}.items():
    register_reward(_name)(_scorer)
