"""The word-level tokenizer shared by the toy policy and the toy reward model."""

from __future__ import annotations

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]")  # ids 0, 1, 2


def build_tokenizer(vocab: list[str], max_len: int) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: lower-cased, split on whitespace / punctuation, [CLS] prepended, [UNK] otherwise."""
    words = list(SPECIAL_TOKENS) + sorted({w.lower() for w in vocab} - set(SPECIAL_TOKENS))
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A", special_tokens=[("[CLS]", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", model_max_length=max_len
    )
