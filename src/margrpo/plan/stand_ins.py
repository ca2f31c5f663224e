"""What a step on random weights needs besides the policy: a few prompts, a word-level tokenizer over them, and a
cheap reward. `benchmarks/real_scale.py`, whose GPU measurements the plan is checked against, takes the same ones,
so that both steps see the same token sequences."""

from __future__ import annotations

PROMPTS = [
    "a red circle on the left of a blue square",
    "three green apples on a wooden table",
    "a cat sitting below a yellow umbrella",
    "two dogs and a black car in the snow",
]


def stand_in_tokenizer():
    """Word-level tokenizer over the prompts' and templates' words, with Qwen's chat special tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    words = ["[UNK]", *special, "user", "assistant", "Generate", "an", "image", ".", ":", *" ".join(PROMPTS).split()]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(dict.fromkeys(words))}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(special)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="<|endoftext|>", eos_token="<|im_end|>"
    )


def brightness(images, prompts, metadata):
    r = images.float().mean((1, 2, 3))  # a cheap stand-in: this measures the trainer, not a scorer
    return r, {"brightness": r}
