"""Reward scorers by name, and their weighted mix.

Every scorer has one signature (``RewardFunction``): images in, one float per image out. A
config names scorers and weights; ``build_reward_mix`` builds only the scorers with a non-zero
weight, and ``RewardMix`` checks each scorer's output and returns every component for logging.

Factories import their implementation inside the function body, so this module imports
without any reward model installed and pays for heavy imports only when a scorer is built.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

__all__ = [
    "RewardFn",
    "RewardFunction",
    "RewardMix",
    "available_rewards",
    "build_reward",
    "build_reward_mix",
    "check_scores",
    "register_reward",
]


class RewardFunction(Protocol):
    """A scorer: ``images`` [B, 3, H, W] float in [0, 1] -> float32 scores [B] (higher is better).

    ``prompts`` and ``metadata`` have one entry per image (metadata: the prompt suite's record,
    e.g. the scene spec a verifiable reward checks against).
    """

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor: ...


RewardFactory = Callable[..., RewardFunction]
# what a trainer calls (a `RewardMix`, or a test's function alike): images, prompts, metadata -> (the mix [B], each
# weighted component [B] by name, for logging)
RewardFn = Callable[[torch.Tensor, list[str], list[dict]], tuple[torch.Tensor, dict[str, torch.Tensor]]]

# name -> factory taking keyword config (paths, options) and returning a RewardFunction
_REGISTRY: dict[str, RewardFactory] = {}


def register_reward(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator registering a factory (class or function of keyword config) under ``name``."""

    def decorator(factory: RewardFactory) -> RewardFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"reward {name!r} is already registered (by {_REGISTRY[name]!r})")
        _REGISTRY[name] = factory
        return factory

    return decorator


def available_rewards() -> list[str]:
    """Registered reward names, sorted."""
    return sorted(_REGISTRY)


def build_reward(name: str, **kwargs: Any) -> RewardFunction:
    """Build the scorer registered as ``name`` with keyword config ``kwargs``."""
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"Unknown reward: {name!r}; expected one of {available_rewards()}") from None
    return factory(**kwargs)


def check_scores(name: str, scores: Any, batch_size: int) -> torch.Tensor:
    """Validate one scorer's output: a tensor of shape [batch_size], all finite; returns float32."""
    if not isinstance(scores, torch.Tensor):
        raise ValueError(
            f"reward {name!r} returned {type(scores).__name__}, expected a torch.Tensor of shape [{batch_size}]"
        )
    if scores.shape != (batch_size,):
        raise ValueError(f"reward {name!r} returned shape {tuple(scores.shape)}, expected [{batch_size}]")
    scores = scores.detach().to(torch.float32)
    finite = torch.isfinite(scores)
    if not bool(finite.all()):
        bad = (~finite).nonzero().flatten().tolist()
        raise ValueError(f"reward {name!r} returned {len(bad)} non-finite score(s) at indices {bad}")
    return scores


class RewardMix:
    """Weighted sum of scorers: total = sum_name weight[name] * score[name].

    Returns the total and every (unweighted) component so each can be logged.
    """

    def __init__(self, weights: Mapping[str, float], scorers: Mapping[str, RewardFunction]):
        if set(weights) != set(scorers):
            raise ValueError(f"weights {sorted(weights)} and scorers {sorted(scorers)} must name the same rewards")
        if not weights:
            raise ValueError("a reward mix needs at least one scorer")
        for name, w in weights.items():
            if not math.isfinite(w):
                raise ValueError(f"reward weight for {name!r} must be finite, got {w}")
        self.weights = dict(weights)
        self.scorers = dict(scorers)

    def __call__(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Score a batch: images [B, 3, H, W] -> (total [B], {name: component [B]}), float32."""
        batch_size = images.shape[0]
        if len(prompts) != batch_size or len(metadata) != batch_size:
            raise ValueError(f"{batch_size} images but {len(prompts)} prompts and {len(metadata)} metadata entries")
        components: dict[str, torch.Tensor] = {}
        total = torch.zeros(batch_size, dtype=torch.float32, device=images.device)  # [B]
        for name, scorer in self.scorers.items():
            scores = check_scores(name, scorer(images, prompts, metadata), batch_size)
            components[name] = scores.to(images.device)  # [B]
            total = total + self.weights[name] * components[name]
        return total, components


def build_reward_mix(
    weights: Mapping[str, float], options: Mapping[str, Mapping[str, Any]] | None = None
) -> RewardMix:
    """Build a ``RewardMix`` from config: ``weights`` name -> weight, ``options`` name -> kwargs.

    A weight of 0 disables a reward without building it (its options may stay in the config);
    options for a name absent from ``weights`` are an error (most likely a typo).
    """
    options = dict(options or {})
    unknown = sorted(set(weights) - set(_REGISTRY))
    if unknown:
        raise ValueError(f"Unknown reward(s): {unknown}; expected names from {available_rewards()}")
    stray = sorted(set(options) - set(weights))
    if stray:
        raise ValueError(f"reward options given for {stray}, which have no weight; add a weight or remove the options")
    active = {name: float(w) for name, w in weights.items() if w != 0}
    if not active:
        raise ValueError(f"all reward weights are 0 ({dict(weights)}); give at least one a non-zero weight")
    scorers = {name: build_reward(name, **options.get(name, {})) for name in active}
    return RewardMix(active, scorers)


# --------------------------------------------------------------------------------------------
# Built-in rewards. Each factory imports its implementation only when built.
# --------------------------------------------------------------------------------------------


@register_reward("shapes")
def _build_shapes(form: str = "strict", **kwargs: Any) -> RewardFunction:
    """The toy world's verifiable reward: the exact scene parser checks the prompt's spec."""
    from margrpo.world.reward import ShapesReward

    return ShapesReward(form=form, **kwargs)


@register_reward("backdrop")
def _build_backdrop(**kwargs: Any) -> RewardFunction:
    """The toy world's aesthetic read exactly from the pixels (the backdrop's brightness): toypref's ground truth."""
    from margrpo.world.reward import BackdropReward

    return BackdropReward(**kwargs)


@register_reward("redness")
def _build_redness(**kwargs: Any) -> RewardFunction:
    """A colour target no prompt names, read exactly from the pixels (mean red - mean blue): the climbing ladder's."""
    from margrpo.world.reward import RednessReward

    return RednessReward(**kwargs)


# The learned toy alignment model (the CLIP analogue, trained by `margrpo train-toyclip`).
@register_reward("toyclip")
def _build_toyclip(path: str, **kwargs: Any) -> RewardFunction:
    """The learned toy image-text scorer loaded from ``path`` (learned, hence hackable)."""
    from margrpo.rewards.toyclip import ToyClipReward

    return ToyClipReward(path=path, **kwargs)


# The learned toy preference model (the HPS analogue, trained by `margrpo train-toypref` from toyclip).
@register_reward("toypref")
def _build_toypref(path: str, **kwargs: Any) -> RewardFunction:
    """Alignment plus the world's aesthetic, learned from synthetic preference pairs (hence hackable)."""
    from margrpo.rewards.toypref import ToyPrefReward

    return ToyPrefReward(path=path, **kwargs)
