"""The reward models' weights on each GPU: the scorers' networks built from their published architectures on the
meta device (transformers' classes; nothing is read or downloaded), their parameters counted in the dtype the
config gives them."""

from __future__ import annotations

import torch


def _hpsv2():
    """open_clip ViT-H-14 in CLIPModel's layout (986.11 M parameters, as open_clip's own profile lists for
    ViT-H-14)."""
    from transformers import CLIPConfig, CLIPModel

    return CLIPModel(
        CLIPConfig(
            text_config=dict(
                hidden_size=1024,
                intermediate_size=4096,
                num_attention_heads=16,
                num_hidden_layers=24,
                vocab_size=49408,
                max_position_embeddings=77,
            ),
            vision_config=dict(
                hidden_size=1280,
                intermediate_size=5120,
                num_attention_heads=16,
                num_hidden_layers=32,
                patch_size=14,
                image_size=224,
            ),
            projection_dim=1024,
        )
    )


def _git_vqa():
    """microsoft/git-large-vqav2 (transformers' GIT conversion: CLIP ViT-L/14 at 420 px plus GitConfig's 6-layer
    decoder)."""
    from transformers import GitConfig, GitForCausalLM

    return GitForCausalLM(
        GitConfig(
            vision_config=dict(
                image_size=420,
                patch_size=14,
                hidden_size=1024,
                intermediate_size=4096,
                num_hidden_layers=24,
                num_attention_heads=16,
            )
        )
    )


def _grounding_dino():
    """IDEA-Research/grounding-dino-base (Swin-B at 384, window 12, BERT-base text encoder, 6 + 6 layers, 900
    queries)."""
    from transformers import GroundingDinoConfig, GroundingDinoForObjectDetection, SwinConfig

    swin = SwinConfig(
        embed_dim=128,
        depths=[2, 2, 18, 2],
        num_heads=[4, 8, 16, 32],
        window_size=12,
        image_size=384,
        out_indices=[2, 3, 4],
    )
    return GroundingDinoForObjectDetection(GroundingDinoConfig(backbone_config=swin))


ARCHITECTURES = {"hpsv2": _hpsv2, "git_vqa": _git_vqa, "grounding_dino": _grounding_dino}


def _reward_model(name: str):
    """The scorer's network built from its published architecture (ARCHITECTURES)."""
    if name not in ARCHITECTURES:
        raise ValueError(f"reward model {name!r}: no architecture known to the plan (hpsv2, git_vqa, grounding_dino)")
    return ARCHITECTURES[name]()


def reward_weights(config: dict, reward: str) -> dict[str, dict]:
    """Parameters and bytes on each GPU of the scorers `rewards.<reward>` uses (dtype: reward_models.<name>.dtype)."""
    out = {}
    for name in config["rewards"][reward]:
        dtype = getattr(torch, config["reward_models"][name].get("dtype", "float32"))
        with torch.device("meta"):
            model = _reward_model(name)
        params = sum(p.numel() for p in model.parameters())
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        out[name] = {
            "params": params,
            "dtype": str(dtype).removeprefix("torch."),
            "bytes": params * torch.empty((), dtype=dtype).element_size() + buffers,
        }
    return out
