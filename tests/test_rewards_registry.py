"""Reward registry and weighted mix, with small dummy scorers."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from margrpo.rewards import (
    RewardMix,
    available_rewards,
    build_reward,
    build_reward_mix,
    register_reward,
    registry,
)

B = 4


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    """Dummy scorers registered by a test disappear after it."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


@pytest.fixture
def batch():
    images = torch.rand(B, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    prompts = ["a red square", "two blue circles", "a cat", "x"]
    metadata = [{"id": i} for i in range(B)]
    return images, prompts, metadata


class Brightness:
    """Mean pixel value per image."""

    def __call__(self, images, prompts, metadata):
        return images.mean(dim=(1, 2, 3))


class PromptLength:
    def __init__(self, scale: float = 1.0):
        self.scale = scale

    def __call__(self, images, prompts, metadata):
        return self.scale * torch.tensor([float(len(p)) for p in prompts], dtype=torch.float64)


class NonFinite:
    def __call__(self, images, prompts, metadata):
        return torch.tensor([0.0, float("nan"), 1.0, float("-inf")])


def register_dummies():
    register_reward("bright")(Brightness)
    register_reward("length")(PromptLength)
    register_reward("broken")(NonFinite)


def test_mix_weights_and_components(batch):
    register_dummies()
    mix = build_reward_mix({"bright": 2.0, "length": 0.5}, {"length": {"scale": 0.1}})
    total, components = mix(*batch)
    images, prompts, _ = batch
    bright = images.mean(dim=(1, 2, 3))
    length = torch.tensor([0.1 * len(p) for p in prompts])
    assert set(components) == {"bright", "length"}
    torch.testing.assert_close(components["bright"], bright)
    torch.testing.assert_close(components["length"], length)  # options reached the factory
    assert total.dtype == torch.float32 and all(c.dtype == torch.float32 for c in components.values())
    torch.testing.assert_close(total, 2.0 * bright + 0.5 * length)


def test_zero_weight_is_not_built(batch):
    register_dummies()
    built = []

    @register_reward("expensive")
    def build_expensive(**kwargs):
        built.append(kwargs)
        return Brightness()

    mix = build_reward_mix({"bright": 1.0, "expensive": 0.0}, {"expensive": {"path": "/nowhere"}})
    total, components = mix(*batch)
    assert built == [] and set(components) == {"bright"}
    torch.testing.assert_close(total, components["bright"])
    with pytest.raises(ValueError, match="all reward weights are 0"):
        build_reward_mix({"expensive": 0.0})


def test_non_finite_scores_name_the_scorer_and_indices(batch):
    register_dummies()
    mix = build_reward_mix({"bright": 1.0, "broken": 1.0})
    with pytest.raises(ValueError, match=r"'broken' returned 2 non-finite score\(s\) at indices \[1, 3\]"):
        mix(*batch)


def test_wrong_shape_is_refused(batch):
    mix = RewardMix({"bad": 1.0}, {"bad": lambda images, prompts, metadata: torch.zeros(B, 1)})
    with pytest.raises(ValueError, match=r"'bad' returned shape \(4, 1\)"):
        mix(*batch)


def test_unknown_name_lists_known_names():
    register_dummies()
    with pytest.raises(ValueError, match=r"Unknown reward: 'nope'.*'bright'"):
        build_reward("nope")
    with pytest.raises(ValueError, match=r"Unknown reward\(s\): \['nope'\].*'length'"):
        build_reward_mix({"bright": 1.0, "nope": 0.0})  # a typo fails even at weight 0


def test_stray_options_and_duplicates_are_errors():
    register_dummies()
    with pytest.raises(ValueError, match="no weight"):
        build_reward_mix({"bright": 1.0}, {"lenght": {"scale": 2.0}})
    with pytest.raises(ValueError, match="already registered"):
        register_reward("bright")(PromptLength)


def test_builtin_rewards_are_registered_lazily():
    assert {"shapes", "toyclip"} <= set(available_rewards())
    # Importing the registry must not import the scorers' implementations.
    code = "import sys, margrpo.rewards; assert 'margrpo.world' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shapes_reward_builds_when_world_exists():
    try:
        available = importlib.util.find_spec("margrpo.world.reward") is not None
    except ModuleNotFoundError:  # margrpo.world itself not written yet
        available = False
    if not available:
        with pytest.raises(ModuleNotFoundError):
            build_reward("shapes")
        pytest.skip("margrpo.world.reward not available yet")
    scorer = build_reward("shapes", form="lenient")
    assert callable(scorer)


def test_redness_reads_the_colour_from_the_pixels_whatever_the_prompt():
    """The climbing ladder's reward: mean red minus mean blue, in [-1, 1], the same for any prompt."""
    images = torch.zeros(3, 3, 8, 8)
    images[0, 0] = 1.0  # pure red
    images[1, 2] = 1.0  # pure blue
    images[2] = 0.5  # grey
    scores, parts = build_reward_mix({"redness": 1.0})(images, ["a red circle", "x", ""], [{}, {}, {}])
    assert torch.equal(scores, torch.tensor([1.0, -1.0, 0.0])) and set(parts) == {"redness"}
    with pytest.raises(ValueError, match="expected images as a"):
        build_reward("redness")(torch.zeros(2, 1, 8, 8), ["a", "b"], [{}, {}])
