"""Tiny random-weight policies and prompt sets shared by the tests."""

import torch

from margrpo.policy import ToyMAR, ToyMARConfig

VOCAB = "a an red blue green circle square triangle and on the left right of above below two three".split()
PROMPTS = ["a red circle", "a blue square", "two green triangles", "a red square on the left of a blue circle"]


def tiny_policy(head: str = "flow", seed: int = 0, dropout: float = 0.0, **overrides) -> ToyMAR:
    torch.manual_seed(seed)
    cfg = dict(head_type=head, vocab=VOCAB, width=32, depth=2, heads=4, head_width=32, head_depth=2,
               text_width=16, text_depth=1, text_heads=2, dropout=dropout)
    cfg.update(overrides)
    policy = ToyMAR(ToyMARConfig(**cfg))
    with torch.no_grad():  # the head starts as zero (adaLN-zero): give it a non-trivial output
        for p in policy.diffloss.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return policy
