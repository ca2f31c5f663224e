"""Per-job import cost: a pipeline stage imports only what it uses (each of ~170 jobs pays it)."""

import subprocess
import sys

import pytest

# The toy training path: transformers (~2.5 CPU-s) is only for the real-scale models, imported inside their functions.
TOY_PATH = [
    "margrpo.stages.train",
    "margrpo.grpo.trainer",
    "margrpo.policy.toy",
    "margrpo.related.maskgrpo.policy",
    "margrpo.rewards.toyclip",
    "margrpo.toylab.toyclip_training",
    "margrpo.toylab.pretraining",
    "margrpo.stages.pretrain",
]


def loaded_after_import(modules: list[str], heavy: list[str]) -> list[str]:
    """The `heavy` top-level packages in sys.modules after importing `modules` in a fresh interpreter."""
    code = (
        f"import sys\nfor m in {modules!r}: __import__(m)\nprint(' '.join(h for h in {heavy!r} if h in sys.modules))"
    )
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()


def test_the_toy_training_path_does_not_import_transformers():
    assert loaded_after_import(TOY_PATH, ["transformers", "diffusers", "peft", "pandas", "matplotlib"]) == []


@pytest.mark.parametrize(
    "stage",
    [
        "train",
        "pretrain",
        "pretrain_mask",
        "train_toyclip",
        "sample",
        "warmup",
        "distill_marval",
        "train_related",
        "uncertainty",
        "make_suites",
        "eval_compbench",
        "check_weights",
    ],
)
def test_stage_modules_leave_heavy_packages_to_their_run(stage):
    """A stage module's top level (what the CLI imports to dispatch) pulls in none of the heavy packages."""
    heavy = ["transformers", "diffusers", "peft", "pandas", "matplotlib", "scipy"]
    assert loaded_after_import([f"margrpo.stages.{stage}"], heavy) == []
