"""The noun phrases and object counts of a prompt, by a small, documented rule set over its words.

T2I-CompBench takes noun chunks from spaCy, which is in neither environment; the word lists and rules
here stand in for it (`noun_phrases`, `object_name`, `singular`, `parse_counts`). The relations and the
detection and VQA tasks built on them are `margrpo.prompts.analysis`. Pure text: no model, no torch.
"""

from __future__ import annotations

import re

__all__ = ["noun_phrases", "object_name", "parse_counts", "singular"]

# ============================================================================ noun phrases
#
# A small, documented rule set stands in for a POS tagger (T2I-CompBench uses spaCy, which is not
# part of either environment). Words are split at punctuation, conjunctions, prepositions, a list
# of common verbs, and -ed/-ing verbs that take an object; what remains are the noun phrases.

_PUNCT = {",", ".", ";", ":", "!", "?"}
_DETERMINERS = {
    "a",
    "an",
    "the",
    "this",
    "that",
    "these",
    "those",
    "its",
    "his",
    "her",
    "their",
    "our",
    "my",
    "your",
    "some",
    "each",
    "every",
    "another",
    "any",
    "no",
    "all",
}
_PRONOUNS = {
    "it",
    "they",
    "them",
    "he",
    "she",
    "him",
    "we",
    "us",
    "i",
    "you",
    "itself",
    "themselves",
    "himself",
    "herself",
}
_SPATIAL_NOUNS = {"top", "bottom", "left", "right", "side", "front", "back", "middle", "center", "centre"}
_CONJUNCTIONS = {"and", "or", "but", "while", "as", "then", "so", "because", "where", "which", "who", "that's"}
_PREPOSITIONS = {
    "of",
    "on",
    "in",
    "at",
    "to",
    "with",
    "by",
    "from",
    "near",
    "next",
    "beside",
    "behind",
    "under",
    "over",
    "above",
    "below",
    "into",
    "onto",
    "inside",
    "outside",
    "against",
    "past",
    "through",
    "across",
    "around",
    "between",
    "for",
    "like",
    "than",
    "underneath",
    "beneath",
    "atop",
    "toward",
    "towards",
    "along",
    "among",
    "within",
    "without",
    "upon",
    "after",
    "before",
    "during",
    "beyond",
    "amid",
    "out",
    "up",
    "down",
    "off",
    "away",
}
_VERBS = {
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "am",
    "has",
    "have",
    "had",
    "do",
    "does",
    "did",
    "can",
    "could",
    "will",
    "would",
    "should",
    "may",
    "might",
    "must",
    "lay",
    "lays",
    "lies",
    "lie",
    "sat",
    "sits",
    "sit",
    "stood",
    "stands",
    "stand",
    "hung",
    "hangs",
    "held",
    "holds",
    "rests",
    "looks",
    "ran",
    "runs",
    "flew",
    "flies",
    "ate",
    "eats",
    "drank",
    "drinks",
    "slept",
    "sleeps",
    "swam",
    "swims",
    "sang",
    "sings",
    "rode",
    "rides",
    "drove",
    "drives",
    "grew",
    "grows",
    "fell",
    "falls",
    "took",
    "takes",
    "gave",
    "gives",
    "made",
    "makes",
    "caught",
    "catches",
    "threw",
    "throws",
    "wore",
    "wears",
    "built",
    "builds",
    "sees",
    "saw",
    "shines",
    "shone",
    "glows",
    "adds",
    "add",
    "gets",
    "got",
    "goes",
    "went",
    "came",
    "comes",
    "reads",
    "read",
    "sleep",
    "play",
    "plays",
    "walks",
    "led",
    "leads",
    "hold",
    "give",
    "take",
    "make",
    "get",
    "see",
    "keep",
    "keeps",
    "kept",
    "contains",
    "covers",
    "reflects",
}
_COLOURS = {
    "black",
    "white",
    "red",
    "green",
    "blue",
    "yellow",
    "brown",
    "pink",
    "purple",
    "orange",
    "gray",
    "grey",
    "gold",
    "golden",
    "silver",
    "beige",
    "violet",
    "cyan",
    "magenta",
}
_NUMBERS = {
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}
_INDEFINITE = {"a", "an"}
_PHOTO_PREFIX = re.compile(r"^\s*(?:a|an)\s+(?:photo|picture|image|painting|drawing)\s+of\s+", re.IGNORECASE)
_TOKEN = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*|[,.;:!?]")
_IRREGULAR_SINGULAR = {
    "people": "person",
    "men": "man",
    "women": "woman",
    "children": "child",
    "mice": "mouse",
    "geese": "goose",
    "teeth": "tooth",
    "feet": "foot",
    "oxen": "ox",
    "knives": "knife",
    "wives": "wife",
    "wolves": "wolf",
    "leaves": "leaf",
    "shelves": "shelf",
    "loaves": "loaf",
    "halves": "half",
    "calves": "calf",
    "scarves": "scarf",
    "tomatoes": "tomato",
    "potatoes": "potato",
    "mangoes": "mango",
    "heroes": "hero",
    "cacti": "cactus",
    "sheep": "sheep",
    "fish": "fish",
    "deer": "deer",
    "series": "series",
    "species": "species",
    "bus": "bus",
    "buses": "bus",
    "glasses": "glasses",
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
    if (
        w == ","
        and len(chunk) == 2
        and chunk[0].lower() in _DETERMINERS
        and nxt is not None
        and (nxt not in _DETERMINERS and nxt not in _CONJUNCTIONS and _count_of(nxt) is None and not _verb_like(nxt))
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


# ---------------------------------------------------------------------------- counts


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
