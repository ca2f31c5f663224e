"""The Harmon head warm-up (design.md §3.11): it trains the head alone, and the quality report counts the images it
exists to repair (the parser finds no object of a palette colour in them)."""

import numpy as np
import pytest
import torch
from helpers import pretrain, tiny_policy

from margrpo.evaluation.failures import failed, failed_share
from margrpo.world import ObjectSpec, Scene, WorldConfig, render


def test_the_warm_up_moves_the_head_and_leaves_every_ar_parameter_as_it_was(tmp_path):
    policy = tiny_policy("ddpm", seed=5)
    head = {id(p) for p in policy.head_parameters()}
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    pretrain(tmp_path / "state", steps=3, policy=policy, train_ar=False)
    moved = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    names_of_head = {n for n, p in policy.named_parameters() if id(p) in head}
    assert moved and moved <= names_of_head, sorted(moved - names_of_head)
    assert all(p.requires_grad for p in policy.parameters())  # handed back trainable, as RL expects


def test_an_image_with_no_object_of_a_palette_colour_counts_as_failed():
    """A drawn object, a bare backdrop and an off-palette grey blob: the last two failed, a share of 2 / 3."""
    cfg = WorldConfig()
    drawn = render(Scene((ObjectSpec("red", "circle", "solid", 14, 16.0, 16.0),), backdrop=0.2), cfg)
    bare = render(Scene((), backdrop=0.2), cfg)
    grey = bare.copy()
    grey[20:40, 20:40] = 200  # bright, but of no palette colour
    assert [failed(img, cfg) for img in (drawn, bare, grey)] == [False, True, True]
    assert failed_share(np.stack([drawn, bare, grey]), cfg) == pytest.approx(2 / 3)
