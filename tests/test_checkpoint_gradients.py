"""Issue 71 item 1: claim b along training (margrpo.reporting.checkpoint_gradients). The paired ratio +Fix / GRPO of
the AR batch gradient's noise finds a known factor between stand-ins and none between equals; it reads the files
rule checkpoint_gradient writes (step 0 the base's first B +Fix batches), names a file of the wrong size, and its
config is checked (ladder variants, saved steps, the base's batches)."""

import copy
import json
import math

import numpy as np
import pytest
import yaml

from margrpo.experiment.config import ConfigError, load_config
from margrpo.reporting.checkpoint_gradients import (
    batches_path,
    checkpoint_gradients,
    mean_norm,
    paired_checkpoint_ratio,
)
from margrpo.reporting.estimators import Batches, noise

P = 400


def gradients(rng, B: int, scale: float, signal: float = 0.2) -> np.ndarray:
    """B batch gradients: a fixed signal along one axis and independent noise of variance scale^2 per coordinate."""
    g = scale * rng.standard_normal((B, P))
    g[:, 0] += signal
    return g


def write_batches(path, G: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "estimator": "fix",
        "images": 24,
        "loss_gradient": True,
        "parameters": P,
        "gram": (G @ G.T).tolist(),
        "proj": G[:, 0].tolist(),
        "cpu_s": [1.0] * len(G),
    }
    path.write_text(json.dumps(record))


def block(tmp_path, scales: dict, seeds=(0, 1, 2, 3, 4), steps=(24, 48), B=16, base_batches=20, seed=0):
    """A results tree as the rules write it: the base's +Fix batches and each checkpoint's, noise scale per variant."""
    rng = np.random.default_rng(seed)
    folder = "estimators/toy-nova/toypref"
    write_batches(tmp_path / folder / "fix" / "batches.json", gradients(rng, base_batches, 1.0))
    for variant, scale in scales.items():
        for s in seeds:
            for t in steps:
                write_batches(tmp_path / batches_path(folder, variant, s, t), gradients(rng, B, scale))
    checkpoints = {"variants": list(scales), "steps": list(steps), "batches": B, "seeds": list(seeds)}
    names = {"policy": "toy-nova", "reward": "toypref", "dir": folder, "estimators": ["fix"]}
    return {**names, "checkpoints": checkpoints}


def test_a_known_factor_in_the_noise_is_found_and_decided(tmp_path):
    """+Fix's batches at 0.6x GRPO's noise scale: noise ratio ~0.36, norm ratio ~0.6, both reproduced."""
    found = checkpoint_gradients(tmp_path, {"blocks": [block(tmp_path, {"grpo": 1.0, "fix": 0.6})]})
    pooled = found.ratios[found.ratios["steps"] == "all"].set_index("statistic")
    assert pooled.loc["noise", "ratio"] == pytest.approx(0.36, rel=0.1)
    assert pooled.loc["noise", "lo"] < 0.36 < pooled.loc["noise", "hi"] < 1
    assert pooled.loc["norm", "ratio"] == pytest.approx(0.6, rel=0.05)
    assert [c["verdict"] for c in found.claims] == ["reproduced", "reproduced"]
    assert {c["claim"] for c in found.claims} == {"b"}
    assert not any("|" in c["metric"] or "|" in c["statement"] for c in found.claims)  # Markdown table cells
    per_step = found.ratios[found.ratios["steps"] != "all"]
    assert sorted(per_step["steps"].unique()) == ["24", "48"]
    # step 0 is the base, the same batches for every variant and seed
    base = found.points[found.points["step"] == 0]
    assert len(base) == 10 and base["noise"].nunique() == 1


def test_equal_noise_is_not_called_lower(tmp_path):
    found = checkpoint_gradients(tmp_path, {"blocks": [block(tmp_path, {"grpo": 1.0, "fix": 1.0}, seed=3)]})
    noise_claim = found.claims[0]
    assert noise_claim["lo"] < 1 < noise_claim["hi"]
    assert noise_claim["verdict"] == "not settled"


def test_one_checkpoint_step_gives_one_row_and_one_claim_per_statistic(tmp_path):
    found = checkpoint_gradients(tmp_path, {"blocks": [block(tmp_path, {"grpo": 1.0, "fix": 0.6}, steps=(2,))]})
    assert list(found.ratios["steps"]) == ["2", "2"] and len(found.claims) == 2
    assert "(steps 2)" in found.claims[0]["statement"] and "| mean \\|g\\| | 2 |" in found.to_markdown()


def test_the_ratio_is_the_geometric_mean_of_the_paired_ratios(tmp_path):
    blk = block(tmp_path, {"grpo": 1.0, "fix": 0.8}, seeds=(0, 1), steps=(24,), B=6)
    points = {}
    for v in ("grpo", "fix"):
        for s in (0, 1):
            points[v, s, 24] = Batches.read(tmp_path / batches_path(blk["dir"], v, s, 24))
    value, lo, hi, per_seed = paired_checkpoint_ratio(points, noise, [0, 1], [24], 0.95, n_boot=200)
    want = [noise(points["fix", s, 24]) / noise(points["grpo", s, 24]) for s in (0, 1)]
    assert value == pytest.approx(math.sqrt(want[0] * want[1]))
    assert per_seed == pytest.approx({0: want[0], 1: want[1]})
    assert mean_norm(points["fix", 0, 24]) == pytest.approx(
        float(np.mean(np.sqrt(np.diag(points["fix", 0, 24].gram))))
    )


def test_a_checkpoint_of_other_batch_seeds_is_named(tmp_path):
    blk = block(tmp_path, {"grpo": 1.0, "fix": 1.0}, seeds=(0,), steps=(24,), B=6)
    wrong = tmp_path / batches_path(blk["dir"], "fix", 0, 24)
    write_batches(wrong, gradients(np.random.default_rng(0), 5, 1.0))
    with pytest.raises(ValueError, match="fix/batches.json: 5 batch seeds"):
        checkpoint_gradients(tmp_path, {"blocks": [blk]})


def test_the_report_writes_its_table_and_figure(tmp_path):
    found = checkpoint_gradients(tmp_path, {"blocks": [block(tmp_path, {"grpo": 1.0, "fix": 0.7})]})
    paths = found.write(tmp_path / "report" / "checkpoint_gradients", formats=("png",))
    names = sorted(p.name for p in paths)
    assert names == [
        "checkpoint_gradients.csv",
        "checkpoint_gradients.md",
        "checkpoint_gradients_ratios.csv",
        "fig_checkpoint_gradients.png",
    ]
    text = (tmp_path / "report" / "checkpoint_gradients.md").read_text()
    assert "+Fix / GRPO" in text and "**reproduced**" in text


@pytest.fixture(scope="module")
def default_config():
    return yaml.safe_load(open("config/config.yaml"))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"variants": ["grpo", "nope"]}, r"checkpoints.variants': \['nope'\] are not ladder variants"),
        ({"steps": [20]}, r"checkpoints.steps': 'grpo' saves no checkpoint at steps \[20\]"),
        ({"batches": 40}, r"checkpoints.batches': step 0 is the base's \+Fix batches"),
    ],
)
def test_a_bad_checkpoints_setting_is_named(tmp_path, default_config, change, message):
    cfg = copy.deepcopy(default_config)
    cfg["experiments"]["estimators"]["checkpoints"].update(change)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_the_default_config_measures_grpo_and_fix_at_two_checkpoints(default_config):
    c = load_config("config/config.yaml")["experiments"]["estimators"]["checkpoints"]
    assert c == {"variants": ["grpo", "fix"], "steps": [24, 48], "batches": 8}  # 8: the verdicts of 16 (findings)
