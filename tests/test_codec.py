"""Toy revision 4's latent tokens (margrpo.policy.codec): the PCA codec's round trip, its fidelity gates on rendered
scenes of the default world, and a latent-token policy that saves, loads and decodes with its own codec."""

import numpy as np
import pytest
import torch
from helpers import VOCAB, tiny_policy

from margrpo.policy import ToyMAR, ToyMARConfig
from margrpo.policy.codec import PatchPCA, from_patches, to_patches
from margrpo.prompts.shapesworld import build_suites
from margrpo.stages.pretrain import fit_world_codec, world_batches
from margrpo.world import PRESETS, scene_for_spec, score
from margrpo.world.scene import backdrop_level, render

WORLD = PRESETS["grid4-lit"]  # the default config's world: grid4 on a per-scene backdrop


def test_patches_round_trip_and_a_full_rank_codec_is_the_identity():
    images = torch.rand(3, 3, 64, 64, generator=torch.Generator().manual_seed(0)) * 2 - 1
    x = to_patches(images, 16)
    assert x.shape == (3, 16, 768) and torch.equal(from_patches(x, 4, 16), images)
    codec = PatchPCA(768, 768)
    codec.fit(x.reshape(-1, 768).repeat(20, 1) + 0.01 * torch.randn(960, 768, generator=torch.Generator()))
    assert torch.allclose(codec.decode(codec.encode(x)), x, atol=1e-4)
    with pytest.raises(ValueError, match="1..768"):
        PatchPCA(768, 0)


def _renders(n_prompts: int = 48, repeats: int = 2):
    rng = np.random.default_rng(0)
    records = build_suites(WORLD, 0, 8, 8, n_prompts)["eval"]
    rows = [r for r in records for _ in range(repeats)]
    return np.stack([render(scene_for_spec(r.spec, rng, WORLD), WORLD) for r in rows]), rows


def test_24_channels_pass_the_fidelity_gates_on_rendered_scenes():
    """Issue 58's gates on decoded renders of evaluation prompts: the parser reads >= 99% of them as it reads the
    renders, and the backdrop level stays within one grey level; 8 channels fail the parser's gate (the gate can
    fail)."""
    images, rows = _renders()
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255

    def decoded(channels: int) -> np.ndarray:
        policy = ToyMAR(ToyMARConfig(vocab=VOCAB, image_size=64, latent_channels=channels))
        fit_world_codec(policy, WORLD)
        out = policy.decode(policy.encode(pixels))
        return (out * 255).round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy()

    def strict(x: np.ndarray) -> float:
        return float(np.mean([score(r.spec, im, r.category, WORLD)["strict"] == 1 for r, im in zip(rows, x)]))

    assert strict(images) == 1.0
    good = decoded(24)
    assert strict(good) >= 0.99
    assert np.abs(backdrop_level(good) - backdrop_level(images)).max() * 255 <= 1.0
    assert strict(decoded(8)) < 0.99


def test_a_latent_token_policy_saves_and_loads_its_codec(tmp_path):
    policy = tiny_policy(latent_channels=12, image_size=64)
    images, _ = world_batches(WORLD)(64, torch.Generator().manual_seed(0))
    kept = fit_world_codec(policy, WORLD)
    assert 0.9 < kept < 1.0 and policy.token_dim == 12 and policy.encode(images).shape == (64, 16, 12)
    policy.save_pretrained(tmp_path / "p")
    loaded = ToyMAR.from_pretrained(tmp_path / "p")
    tokens = policy.encode(images)
    assert torch.equal(loaded.encode(images), tokens) and torch.equal(loaded.decode(tokens), policy.decode(tokens))
    assert not any(n.startswith("codec.") for n, _ in policy.named_parameters())  # frozen: buffers, never trained


def test_pixel_tokens_are_the_standardised_patches_as_before():
    policy = tiny_policy(image_size=64, token_norm=(0.1, 0.5))
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    g, p = 4, 16
    old = ((images * 2 - 1 - 0.1) / 0.5).reshape(-1, 3, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(-1, 16, 768)
    assert torch.equal(policy.encode(images), old)
    assert torch.allclose(policy.decode(old), images, atol=1e-6)
