"""Tiny random models of the real reward scorers' classes, built locally from a config (no download): CLIP,
BLIP-VQA, GIT and Grounding DINO, a random aesthetic MLP; and hand-made detections. The `tiny` fixture
(tests/conftest.py) builds each once per session."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

import margrpo.rewards.real as real
from margrpo.infra.compat import ensure_torchvision_importable
from margrpo.rewards.real.detection import Detections

# In .venv-eval torchvision (a CUDA build) is installed and transformers' image processors import
# it: the CPU-torch workaround must come first (the scorers do this themselves; the builders too).
if importlib.util.find_spec("torchvision") is not None:
    ensure_torchvision_importable()

WORDS = (
    "a an the red green blue bench bowl cat cats dog dogs on left right of top next to and two three "
    "yes no photo bee refrigerator"
).split()


def bert_tokenizer(directory: Path):
    """A BertTokenizerFast over WORDS (+ BLIP's [DEC]) from a local vocab.txt."""
    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", ".", "?", ","] + WORDS
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    return BertTokenizerFast(vocab_file=str(directory / "vocab.txt"), do_lower_case=True)


def clip_tokenizer(directory: Path):
    """A CLIPTokenizer with byte-level characters only (no merges): every text tokenises offline."""
    from transformers import CLIPTokenizer
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    chars = list(bytes_to_unicode().values())
    vocab = {t: i for i, t in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\n")
    return CLIPTokenizer(str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=77)


def tiny_clip(directory: Path, projection_dim: int = 16) -> Path:
    """CLIPModel + CLIPProcessor (32-px images) saved to `directory`."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    tok = clip_tokenizer(directory / "_tok")
    cfg = CLIPConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=77,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        projection_dim=projection_dim,
    )
    torch.manual_seed(0)
    CLIPModel(cfg).save_pretrained(directory)
    ip = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=ip, tokenizer=tok).save_pretrained(directory)
    return directory


def tiny_blip_vqa(directory: Path) -> Path:
    from transformers import BlipConfig, BlipForQuestionAnswering, BlipImageProcessor, BlipProcessor

    tok = bert_tokenizer(directory / "_tok")
    text = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
        bos_token_id=tok.convert_tokens_to_ids("[DEC]"),
        pad_token_id=0,
        sep_token_id=tok.sep_token_id,
    )
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8
    )
    torch.manual_seed(0)
    BlipForQuestionAnswering(BlipConfig(text_config=text, vision_config=vision)).save_pretrained(directory)
    BlipProcessor(BlipImageProcessor(size={"height": 32, "width": 32}), tok).save_pretrained(directory)
    return directory


def tiny_git(directory: Path) -> Path:
    from transformers import CLIPImageProcessor, GitConfig, GitForCausalLM, GitProcessor

    tok = bert_tokenizer(directory / "_tok")
    cfg = GitConfig(
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    GitForCausalLM(cfg).save_pretrained(directory)
    ip = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    GitProcessor(ip, tok).save_pretrained(directory)
    return directory


def tiny_grounding_dino(directory: Path) -> Path:
    """A 0.13M-parameter Grounding DINO (Swin + BERT, 1 layer each, 10 queries) at 64 px; about 0.03 s a batch."""
    from transformers import (
        BertConfig,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessor,
        GroundingDinoProcessor,
        SwinConfig,
    )

    tok = bert_tokenizer(directory / "_tok")
    cfg = GroundingDinoConfig(
        backbone_config=SwinConfig(
            image_size=64,
            patch_size=4,
            embed_dim=8,
            depths=[1, 1, 1, 1],
            num_heads=[1, 1, 1, 1],
            window_size=2,
            out_features=["stage2", "stage3", "stage4"],
        ),
        text_config=BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=64,
        ),
        num_queries=10,
        encoder_layers=1,
        decoder_layers=1,
        d_model=32,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        num_feature_levels=3,
        encoder_n_points=1,
        decoder_n_points=1,
        max_text_len=32,
        disable_custom_kernels=True,
    )
    torch.manual_seed(0)
    GroundingDinoForObjectDetection(cfg).save_pretrained(directory)
    ip = GroundingDinoImageProcessor(size={"shortest_edge": 64, "longest_edge": 64})
    GroundingDinoProcessor(image_processor=ip, tokenizer=tok).save_pretrained(directory)
    return directory


def tiny_aesthetic_mlp(path: Path, input_size: int = 16) -> Path:
    torch.manual_seed(1)
    mlp = real.AestheticMLP(input_size)
    state = {k: v.contiguous() for k, v in mlp.state_dict().items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path


def dets(*boxes_scores) -> Detections:
    """Detections of one name from (box, score) pairs, as a detector would return them (none without pairs)."""
    if not boxes_scores:
        return Detections()
    boxes = torch.tensor([b for b, _ in boxes_scores], dtype=torch.float32)
    return Detections(boxes, torch.tensor([s for _, s in boxes_scores]))


def tiny_scorers(root: Path) -> dict[str, dict]:
    """name -> scorer options pointing at tiny local models freshly built under `root`."""
    clip = tiny_clip(root / "clip")
    return {
        "pickscore": {"path": str(clip), "processor_path": str(clip)},
        "clipscore": {"path": str(clip)},
        "aesthetic": {"path": str(tiny_aesthetic_mlp(root / "aesthetic.pth")), "clip_path": str(clip)},
        "vqa": {"path": str(tiny_blip_vqa(root / "blip"))},
        "git_vqa": {"path": str(tiny_git(root / "git"))},
        "grounding_dino": {"path": str(tiny_grounding_dino(root / "gdino")), "box_threshold": 0.0},
    }
