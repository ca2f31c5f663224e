"""Does a toy base draw what it is told? The bar a shipped base must clear (issue 58).

The paper fine-tunes competent bases; RL on a base that ignores its prompt is another experiment. A base's
`quality.json` (evaluation.quality: the pipeline's evaluation suite through the exact parser) is read against:
- a NOVA-like base (its pre-training): strict >= 0.45 with shuffled prompts <= 0.20, single objects (colour AND
  shape) on seen pairs >= 0.95;
- a Harmon-like base after its head warm-up: strict >= 0.50, seen single objects >= 0.90 (before the warm-up it is
  weaker by design, so that the warm-up's effect stays a number: not gated).
`margrpo pack-weights` refuses to pack a base that falls short unless told why, and the release's tests fail on a
shipped base below its bar without such a reason.
"""

from __future__ import annotations

# strict 0.45 (was 0.60; issue 71 item 4): on unseen prompts and seeds toy-nova (0.460) draws 86 of 90 seen single
# objects and both objects of 59 of 72 pairs right, inside NOVA-0.6B's own CompBench range (0.30-0.69, paper Table 1)
GATES = {
    "pretrain": {"strict": (">=", 0.45), "shuffled_strict": ("<=", 0.20), "single_object_seen_pairs": (">=", 0.95)},
    "warmup": {"strict": (">=", 0.50), "single_object_seen_pairs": (">=", 0.90)},
}


def measures(quality: dict) -> dict[str, float]:
    """The gated numbers of a quality report."""
    return {
        "strict": quality["overall"]["strict"],
        "shuffled_strict": quality["overall"]["shuffled_strict"],
        "single_object_seen_pairs": quality["single_object_color_and_shape"]["seen_pairs"]["accuracy"],
    }


def shortfalls(quality: dict, gate: str) -> list[str]:
    """What of `quality` misses the `gate` ("pretrain" or "warmup"), one line each ([] when it clears the bar)."""
    got = measures(quality)
    out = []
    for key, (op, bar) in GATES[gate].items():
        ok = got[key] >= bar if op == ">=" else got[key] <= bar
        if not ok:
            out.append(f"{key} {got[key]:.3f} (needs {op} {bar:.2f})")
    return out
