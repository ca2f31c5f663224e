"""The word-level tokenizer shared by the toy policies and the toy reward model.

Our own small wrapper on `tokenizers` rather than `transformers`' PreTrainedTokenizerFast: importing
`transformers` cost ~2.5 CPU-s per pipeline job (the text encoder is `margrpo.policy.layers.TextEncoder`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from torch import Tensor

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]")  # ids 0, 1, 2
TOKENIZER_FILE = "tokenizer.json"


class WordTokenizer:
    """Prompts -> padded `input_ids` / `attention_mask` tensors; a model folder keeps it as <folder>/tokenizer.json."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest prompt of the batch, on the right

    def __call__(self, prompts: list[str], max_length: int, fixed_length: bool = False) -> dict[str, Tensor]:
        """[CLS] + words, truncated to `max_length` tokens; pads get id 0 and mask 0. `fixed_length`: every prompt
        padded to `max_length` (a batch's shapes then never depend on its longest prompt)."""
        self.tokenizer.enable_truncation(max_length)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", length=max_length if fixed_length else None)
        encodings = self.tokenizer.encode_batch(list(prompts))
        if not encodings:
            return {
                "input_ids": torch.zeros(0, 0, dtype=torch.long),
                "attention_mask": torch.zeros(0, 0, dtype=torch.long),
            }
        return {
            "input_ids": torch.tensor([e.ids for e in encodings]),
            "attention_mask": torch.tensor([e.attention_mask for e in encodings]),
        }

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def save_pretrained(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(d / TOKENIZER_FILE))

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> WordTokenizer:
        """Reads <directory>/tokenizer.json (also the one transformers wrote into older model folders)."""
        path = Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{directory}: not a tokenizer folder ({TOKENIZER_FILE} missing)")
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as err:  # tokenizers raises a bare Exception for unparsable files
            from margrpo.infra.files import InputError

            raise InputError(
                f"{path}: unreadable tokenizer ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
            ) from None


def build_tokenizer(vocab: list[str]) -> WordTokenizer:
    """Word-level tokenizer: lower-cased, split on whitespace / punctuation, [CLS] prepended, [UNK] otherwise."""
    words = list(SPECIAL_TOKENS) + sorted({w.lower() for w in vocab} - set(SPECIAL_TOKENS))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A", special_tokens=[("[CLS]", 2)])
    return WordTokenizer(tok)
