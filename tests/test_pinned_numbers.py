"""Every number stays as it was through a refactor (issue 69): four short runs of the tiny toy
(tests/pinned_numbers.py) against the numbers 044f26d's code made, before the method moved into grpo/variants.py and
the related trainers into the run loop. On the CPU that made them they must be the same bits; elsewhere within a
tolerance far below what a changed loss weight, mask or step order moves (float kernels differ between CPU models)."""

import json
import math
from pathlib import Path

import pytest
from pinned_numbers import cpu, numbers

PINNED = Path(__file__).parent / "data" / "pinned-numbers.json"


def _close(a, b, rel=1e-3, abs_=1e-6) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == pytest.approx(b, rel=rel, abs=abs_)


def test_the_refactor_moved_no_number():
    pinned = json.loads(PINNED.read_text())
    now = numbers()
    assert set(now["runs"]) == set(pinned["runs"])
    if now["cpu"] == pinned["cpu"] and now["torch"] == pinned["torch"]:
        # the machine that pinned them: every logged value and every weight the same bits
        assert json.dumps(now["runs"], sort_keys=True) == json.dumps(pinned["runs"], sort_keys=True)
        return
    for name, run in pinned["runs"].items():
        got = now["runs"][name]
        assert len(got["rows"]) == len(run["rows"]), name
        for step, (row, want) in enumerate(zip(got["rows"], run["rows"])):
            assert set(row) == set(want), (name, step)
            bad = {k: (row[k], want[k]) for k in want if not _close(row[k], want[k])}
            assert not bad, f"{name} step {step}: moved {bad}"
        moved = {k: (got["weights"][k], w) for k, w in run["weights"].items() if not _close(got["weights"][k], w)}
        assert not moved, f"{name}: trained weights moved {moved}"


def test_the_pin_is_sensitive_to_a_changed_loss(monkeypatch):
    """A test that could fail: the same comparison sees a KL weight of 0.011 instead of 0.01 (the smallest change a
    slip in the loss makes is larger)."""
    import pinned_numbers

    pinned = json.loads(PINNED.read_text())["runs"]["grpo_chunked"]
    monkeypatch.setitem(pinned_numbers.RUNS, "grpo_chunked", dict(pinned_numbers.RUNS["grpo_chunked"], beta=0.011))
    got = pinned_numbers.run(pinned_numbers.RUNS["grpo_chunked"])
    moved = [k for k, w in pinned["weights"].items() if not _close(got["weights"][k], w)]
    rows_moved = [k for k in pinned["rows"][-1] if not _close(got["rows"][-1][k], pinned["rows"][-1][k])]
    assert moved or rows_moved


def test_the_pin_names_its_cpu():
    assert json.loads(PINNED.read_text())["cpu"].startswith("Vendor ID") and cpu()
