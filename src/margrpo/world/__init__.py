"""ShapesWorld: the toy compositional world (scenes, renderer, captions, exact parser, scorer).

Knows nothing about models, prompts files or training: the prompt suites built from its captioned
scenes are `margrpo.prompts.shapesworld`. Typical use:

    cfg = WorldConfig()
    scene, prompt, category, spec = sample_captioned(rng, cfg)      # a pre-training pair (world.captions)
    image = render(scene, cfg)                                      # (32, 32, 3) uint8
    score(spec, image, category, cfg)["strict"]                     # 1.0 for a faithful render
Layer 1 (see margrpo/__init__.py): it must not import prompts, policy, rewards, grpo, toylab, related,
evaluation, reporting, experiment, stages, plan, cli.
"""

from margrpo.world.captions import (
    canonical_key,
    caption_scene,
    heldout_in_spec,
    prompt_for_spec,
    prompt_vocabulary,
    scene_for_spec,
    validate_spec,
)
from margrpo.world.config import CATEGORIES, PALETTE, PRESETS, RELATIONS, SHAPES, TEXTURES, WorldConfig
from margrpo.world.parser import parse
from margrpo.world.scene import ObjectSpec, Scene, relation_holds, render, sample_scene
from margrpo.world.scoring import score, score_objects

__all__ = [
    "CATEGORIES",
    "PALETTE",
    "PRESETS",
    "RELATIONS",
    "SHAPES",
    "TEXTURES",
    "WorldConfig",
    "ObjectSpec",
    "Scene",
    "sample_scene",
    "render",
    "relation_holds",
    "caption_scene",
    "scene_for_spec",
    "prompt_for_spec",
    "prompt_vocabulary",
    "validate_spec",
    "canonical_key",
    "heldout_in_spec",
    "parse",
    "score",
    "score_objects",
]
