"""A frozen linear latent codec for the toy: principal components of 16 x 16 pixel patches.

NOVA's and Harmon's tokens are 16-channel VAE latents, not pixels. ShapesWorld's patches are so
regular (a cell holds a flat backdrop or one of a few dozen object crops) that a linear map keeps
them: the top C components of the training scenes' patches, fitted once in float64 and frozen.
Encoding is a projection, decoding its transpose, both exact functions the reward sees through.
Findings, "Latent tokens for toy revision 4", has the fidelity gates that chose C.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def to_patches(images: Tensor, patch: int) -> Tensor:
    """[B, 3, H, W] -> [B, (H/p)(W/p), 3 p p], raster order of patches, channel-major inside a patch."""
    B, C, H, W = images.shape
    g, h = H // patch, W // patch
    x = images.reshape(B, C, g, patch, h, patch).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(B, g * h, C * patch * patch)


def from_patches(x: Tensor, grid: int, patch: int) -> Tensor:
    """The inverse of `to_patches` for a square grid."""
    B = x.shape[0]
    x = x.reshape(B, grid, grid, 3, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(B, 3, grid * patch, grid * patch)


class PatchPCA(nn.Module):
    """x [..., D] in [-1, 1] -> ((x - mean) @ basis.T) / scale [..., C], and back.

    One global `scale` (the components' mean std), as a VAE's latents get one scaling factor: the
    token MSE stays proportional to the pixel MSE inside the kept subspace, so a small component is a
    small error, as it is in the image. The buffers are persistent: a policy's weights file carries
    its codec, and a loaded policy decodes as it was trained.
    """

    def __init__(self, dim: int, channels: int):
        super().__init__()
        if not 0 < channels <= dim:
            raise ValueError(f"latent channels must lie in 1..{dim}, got {channels}")
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("basis", torch.eye(channels, dim))  # [C, D], orthonormal rows
        self.register_buffer("scale", torch.ones(()))

    @torch.no_grad()
    def fit(self, patches: Tensor) -> float:
        """Set the codec from patches [N, D] (float64 SVD); returns the share of variance kept."""
        x = patches.reshape(-1, patches.shape[-1]).double()
        mean = x.mean(0)
        _, s, vt = torch.linalg.svd(x - mean, full_matrices=False)
        C = self.basis.shape[0]
        basis = vt[:C]
        z = (x - mean) @ basis.T
        self.mean.copy_(mean.float())
        self.basis.copy_(basis.float())
        self.scale.copy_(z.std(0).pow(2).mean().sqrt().float())
        return float((s[:C] ** 2).sum() / (s**2).sum())

    def encode(self, x: Tensor) -> Tensor:
        return (x.float() - self.mean) @ self.basis.T / self.scale

    def decode(self, z: Tensor) -> Tensor:
        return (z.float() * self.scale) @ self.basis + self.mean
