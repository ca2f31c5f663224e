"""Real reward scorers (margrpo.rewards.real) on tiny random models of the real classes.

Every model and processor here is built locally from a config (no download): tiny CLIP, BLIP-VQA,
GIT and Grounding DINO, and a random aesthetic MLP (tests/builders_real.py; the `tiny` fixture).
hpsv2 / image-reward live only in the evaluator environment (.venv-eval): their model tests skip
here, naming the missing package; the missing-file errors are tested for every scorer. The rules
the scorers apply without a model: test_rewards_real_rules.py.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from builders_real import WORDS, bert_tokenizer, dets, tiny_aesthetic_mlp

import margrpo.rewards.real as real
from margrpo.rewards import available_rewards, build_reward, build_reward_mix
from margrpo.rewards.real.detection import Detections
from margrpo.rewards.real.vqa import _PhraseVQA

REAL_NAMES = ["pickscore", "clipscore", "aesthetic", "vqa", "git_vqa", "grounding_dino", "hpsv2", "imagereward"]
PROMPTS = ["a red bench and a blue bowl", "two cats", "a dog on the left of a bench"]


def images(n: int = 3, size: int = 40, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=g)  # [n, 3, s, s] in [0, 1]


TRANSFORMERS_NAMES = ["pickscore", "clipscore", "aesthetic", "vqa", "git_vqa", "grounding_dino"]


# ============================================================================ scorers through the registry


def test_real_rewards_are_registered():
    assert set(REAL_NAMES) <= set(available_rewards())


@pytest.mark.parametrize("name", TRANSFORMERS_NAMES)
def test_scorer_through_reward_mix(tiny, name):
    mix = build_reward_mix({name: 1.0}, {name: tiny[name]})
    x = images()
    meta = [{}, {}, {}]
    total, parts = mix(x, PROMPTS, meta)
    assert total.shape == (3,) and total.dtype == torch.float32
    assert torch.isfinite(total).all()
    again, _ = mix(x, PROMPTS, meta)
    assert torch.equal(total, again)  # deterministic: eval mode, no sampling
    assert torch.equal(parts[name], total)


@pytest.mark.parametrize("name", TRANSFORMERS_NAMES)
def test_batching_does_not_change_scores(tiny, name):
    x = images(4, seed=1)
    prompts = [*PROMPTS, "three dogs and a cat"]
    one = build_reward(name, **tiny[name], batch_size=1)(x, prompts, [{}] * 4)
    four = build_reward(name, **tiny[name], batch_size=4)(x, prompts, [{}] * 4)
    torch.testing.assert_close(one, four, atol=1e-5, rtol=1e-5)


def test_score_ranges(tiny):
    x = images()
    for name in ("vqa", "git_vqa", "grounding_dino"):
        s = build_reward(name, **tiny[name])(x, PROMPTS, [{}] * 3)
        assert ((s >= 0) & (s <= 1)).all(), (name, s)
    cos = build_reward("clipscore", **tiny["clipscore"])(x, PROMPTS, [{}] * 3)
    assert ((cos >= -1) & (cos <= 1)).all()
    s100 = build_reward("clipscore", **tiny["clipscore"], form="clipscore_100")(x, PROMPTS, [{}] * 3)
    torch.testing.assert_close(s100, 100 * cos.clamp(min=0))
    pick = build_reward("pickscore", **tiny["pickscore"])(x, PROMPTS, [{}] * 3)
    torch.testing.assert_close(pick / cos, torch.full((3,), pick[0].item() / cos[0].item()), rtol=1e-4, atol=1e-4)


def test_aesthetic_mlp_layout_and_safetensors(tiny, tmp_path):
    mlp = real.AestheticMLP(768)
    assert sorted(mlp.state_dict()) == sorted(f"layers.{i}.{p}" for i in (0, 2, 4, 6, 7) for p in ("weight", "bias"))
    assert [m.out_features for m in mlp.layers if isinstance(m, torch.nn.Linear)] == [1024, 128, 64, 16, 1]
    st = tiny_aesthetic_mlp(tmp_path / "mlp.safetensors")
    a = build_reward("aesthetic", **tiny["aesthetic"])(images(), PROMPTS, [{}] * 3)
    b = build_reward("aesthetic", path=str(st), clip_path=tiny["aesthetic"]["clip_path"])(images(), PROMPTS, [{}] * 3)
    torch.testing.assert_close(a, b)  # same seed, same weights, either file format
    wrong = tiny_aesthetic_mlp(tmp_path / "wide.pth", input_size=24)
    with pytest.raises(ValueError, match="24-d embeddings"):
        build_reward("aesthetic", path=str(wrong), clip_path=tiny["aesthetic"]["clip_path"])


def test_vqa_uses_metadata_phrases_and_skips_tasks(tiny):
    git = build_reward("git_vqa", **tiny["git_vqa"])
    x = images(2)
    meta = [{"task_type": "spatial"}, {"task_type": "color", "attr_nouns": ["red bench"]}]
    s = git(x, ["a dog on the left of a bench", "a photo of a red bench"], meta)
    assert s[0] == 0.0  # T2I-R1: spatial prompts get no VQA reward
    alone = git(x[1:], ["whatever"], [{"attr_nouns": ["red bench"]}])
    torch.testing.assert_close(s[1:], alone)  # the metadata phrase, not the prompt, is asked


# ============================================================================ VQA reduction (stubbed probabilities)


class _FixedVQA(_PhraseVQA):
    """P(yes) = 0.5 for questions with "red", else 0.8: tests the reduction without a model."""

    def __init__(self, reduce):
        super().__init__(reduce, skip_tasks=("numeracy",), max_phrases=8, device="cpu", batch_size=2)

    def _yes_probability(self, pil, owners, questions):
        assert len(pil) == len(set(owners)) == max(owners) + 1  # only images with questions
        return torch.tensor([0.5 if "red" in q else 0.8 for q in questions])


def test_vqa_product_mean_empty_and_skip():
    x = images(4)
    prompts = ["a red bench and a blue bowl", "a blue bowl", "the top", "two cats"]
    meta = [{}, {}, {}, {"category": "numeracy"}]
    torch.testing.assert_close(_FixedVQA("product")(x, prompts, meta), torch.tensor([0.4, 0.8, 1.0, 0.0]))
    torch.testing.assert_close(_FixedVQA("mean")(x, prompts, meta), torch.tensor([0.65, 0.8, 1.0, 0.0]))
    with pytest.raises(ValueError, match="Unknown reduce"):
        _FixedVQA("max")


# ============================================================================ Grounding DINO's detections


def test_grounding_dino_reward_logic_on_fake_detections(tiny, monkeypatch):
    """The reward's dispatch over tasks, with the detector's output replaced by hand-made boxes."""
    det = build_reward("grounding_dino", **tiny["grounding_dino"])
    fake = {
        "dog": dets(([0.0, 0.4, 0.2, 0.6], 0.9)),
        "bench": dets(([0.6, 0.4, 0.8, 0.6], 0.6)),
        "cat": dets(([0, 0, 0.3, 0.3], 0.8), ([0.5, 0.5, 0.9, 0.9], 0.7)),
    }
    seen = []

    def detect(images, names):
        seen.append([list(n) for n in names])
        return [{n: fake.get(n, Detections()) for n in ns} for ns in names]

    monkeypatch.setattr(det, "detect", detect)
    prompts = [
        "a dog on the left of a bench",
        "a bench on the left of a dog",
        "two cats",
        "three cats",
        "a red bench and a cat",
        "a landscape",
    ]
    s = det(images(6), prompts, [{}] * 6)
    torch.testing.assert_close(s, torch.tensor([0.9, 0.4, 1.0, 0.2, 0.5, 0.0]))
    assert seen[0][:3] == [["dog", "bench"], ["bench", "dog"], ["cat"]]


def test_grounding_dino_query_spans_and_detect(tiny):
    text, spans = real.GroundingDinoReward.query(["cat", "red bench"])
    assert text == "cat . red bench ." and [text[a:b] for a, b in spans] == ["cat", "red bench"]
    det = build_reward("grounding_dino", **tiny["grounding_dino"])
    out = det.detect(images(2), [["cat", "red bench"], []])
    assert set(out[0]) == {"cat", "red bench"} and out[1] == {}
    d = out[0]["red bench"]
    assert d.boxes.shape == (len(d), 4) and torch.all(d.scores[:-1] >= d.scores[1:])  # best first


# ============================================================================ missing files, missing packages


@pytest.mark.parametrize(
    "name, options, expected",
    [
        ("pickscore", {"path": "{missing}/PickScore_v1"}, r"PickScore_v1 not found.*config\.json.*PickScore_v1"),
        ("clipscore", {"path": "{missing}/clip"}, r"clip not found.*config\.json.*reward_models\.clipscore\.path"),
        (
            "aesthetic",
            {"path": "{missing}/sac+logos+ava1-l14-linearMSE.pth", "clip_path": "{missing}/clip"},
            r"sac\+logos\+ava1-l14-linearMSE\.pth not found.*improved-aesthetic-predictor",
        ),
        ("vqa", {"path": "{missing}/blip-vqa"}, r"blip-vqa not found.*config\.json.*blip-vqa"),
        ("git_vqa", {"path": "{missing}/git-large-vqav2"}, r"git-large-vqav2 not found.*reward_models\.git_vqa\.path"),
        (
            "grounding_dino",
            {"path": "{missing}/grounding-dino-base"},
            r"grounding-dino-base not found.*grounding-dino",
        ),
        (
            "hpsv2",
            {"path": "{missing}/HPS_v2.1_compressed.pt"},
            r"HPS_v2\.1_compressed\.pt not found.*xswu/HPSv2.*reward_models\.hpsv2\.path",
        ),
        (
            "imagereward",
            {"path": "{missing}/ImageReward.pt", "med_config": "{missing}/med_config.json"},
            r"ImageReward\.pt not found.*THUDM/ImageReward",
        ),
    ],
)
def test_missing_path_names_the_expected_file(tmp_path, name, options, expected):
    options = {k: v.format(missing=tmp_path / "weights") for k, v in options.items()}
    with pytest.raises(FileNotFoundError, match=expected):
        build_reward_mix({name: 1.0}, {name: options})


def test_missing_processor_and_second_files(tiny, tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"nope not found.*preprocessor_config\.json.*reward_models\.pickscore\.processor_path"
    ):
        build_reward("pickscore", path=tiny["pickscore"]["path"], processor_path=str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=r"clip not found.*clip-vit-large-patch14"):
        build_reward("aesthetic", path=tiny["aesthetic"]["path"], clip_path=str(tmp_path / "clip"))
    ckpt = tmp_path / "ImageReward.pt"
    ckpt.write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"med_config\.json not found.*reward_models\.imagereward\.med_config"):
        build_reward("imagereward", path=str(ckpt), med_config=str(tmp_path / "med_config.json"))
    with pytest.raises(ValueError, match="option 'path' is required"):
        build_reward("hpsv2", path=None)


@pytest.mark.parametrize(
    "name, module, package", [("hpsv2", "hpsv2", "hpsv2"), ("imagereward", "ImageReward", "image-reward")]
)
def test_evaluator_package_missing_says_how_to_install(tmp_path, name, module, package):
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{package} is installed here; the missing-package message applies to the core venv")
    (tmp_path / "ckpt.pt").write_bytes(b"")
    (tmp_path / "med_config.json").write_text("{}")
    options = {"path": str(tmp_path / "ckpt.pt")}
    if name == "imagereward":
        options["med_config"] = str(tmp_path / "med_config.json")
    with pytest.raises(ImportError, match=rf"{package}.*make evaluators \(or envs/evaluators\.yaml\)"):
        build_reward(name, **options)


# ============================================================================ evaluator stack (.venv-eval only)

TINY_OPEN_CLIP = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def test_hpsv2_tiny_open_clip(tmp_path):
    pytest.importorskip("hpsv2", reason="hpsv2 is not installed (it lives in .venv-eval: make evaluators)")
    from margrpo.infra.compat import ensure_torchvision_importable

    ensure_torchvision_importable()
    from hpsv2.src.open_clip import add_model_config, create_model

    config = tmp_path / "tiny-hps.json"
    config.write_text(json.dumps(TINY_OPEN_CLIP))
    add_model_config(config)  # registers "tiny-hps" to build the random checkpoint
    torch.manual_seed(0)
    model = create_model("tiny-hps", pretrained=None)
    torch.save({"state_dict": model.state_dict()}, tmp_path / "HPS_tiny.pt")
    # the scorer reads the architecture from clip_path: here the Hugging Face layout (open_clip_config.json)
    (tmp_path / "open_clip").mkdir()
    (tmp_path / "open_clip" / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_OPEN_CLIP}))
    options = {
        "path": str(tmp_path / "HPS_tiny.pt"),
        "clip_path": str(tmp_path / "open_clip"),
        "model_name": "tiny-hf",
    }
    mix = build_reward_mix({"hpsv2": 1.0}, {"hpsv2": options})
    x = images(3)
    total, _ = mix(x, PROMPTS, [{}] * 3)
    assert total.shape == (3,) and torch.isfinite(total).all() and (total.abs() <= 1).all()
    assert torch.equal(total, mix(x, PROMPTS, [{}] * 3)[0])
    one = build_reward("hpsv2", **options, batch_size=1)(x, PROMPTS, [{}] * 3)
    torch.testing.assert_close(one, total, atol=1e-5, rtol=1e-5)
    bad = {"embed_dim": 16}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="not an open_clip model config"):
        build_reward("hpsv2", path=options["path"], clip_path=str(tmp_path / "bad.json"))
    with pytest.raises(FileNotFoundError, match=r"no-config not found.*open_clip_config\.json.*clip_path"):
        build_reward("hpsv2", path=options["path"], clip_path=str(tmp_path / "no-config"))
    with pytest.raises(ValueError, match="unknown model_name 'ViT-Z-99'"):
        build_reward("hpsv2", path=options["path"], model_name="ViT-Z-99")


def test_imagereward_tokenizer_request_is_answered_from_a_local_folder(tmp_path, monkeypatch):
    """ImageReward's BLIP calls BertTokenizer.from_pretrained('bert-base-uncased'); with `tokenizer_path`
    that call reads the local folder during the load, offline, and the module is restored after."""
    import sys
    import types

    from transformers import BertTokenizer

    from margrpo.rewards.real.evaluator_stack import _bert_base_uncased_from

    blip = types.ModuleType("ImageReward.models.BLIP.blip")
    blip.BertTokenizer = BertTokenizer
    for name in ("ImageReward", "ImageReward.models", "ImageReward.models.BLIP"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "ImageReward.models.BLIP.blip", blip)
    sys.modules["ImageReward.models.BLIP"].blip = blip
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bert_tokenizer(tmp_path / "tok")
    with _bert_base_uncased_from(str(tmp_path / "tok")):
        tok = blip.BertTokenizer.from_pretrained("bert-base-uncased")  # what the package's init_tokenizer does
    assert tok.convert_tokens_to_ids("[DEC]") == 5 and blip.BertTokenizer is BertTokenizer


@pytest.mark.slow
def test_imagereward_random_weights(tmp_path, monkeypatch):
    """ImageReward's BLIP is hard-coded to ViT-L (300M parameters) and asks for the bert-base-uncased
    tokenizer by hub name: with a local tiny tokenizer folder as `tokenizer_path`, a tiny text config
    and an empty checkpoint (the package loads with strict=False), the batched path runs on random
    weights (about 15 s on one CPU thread, hence slow), and nothing is looked up on the hub."""
    pytest.importorskip(
        "ImageReward", reason="image-reward is not installed (it lives in .venv-eval: make evaluators)"
    )
    import ImageReward.models.BLIP.blip as blip

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bert_tokenizer(tmp_path / "tok")
    original = blip.BertTokenizer
    med = {
        "architectures": ["BertModel"],
        "hidden_act": "gelu",
        "hidden_size": 768,
        "intermediate_size": 64,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": 64,
        "model_type": "bert",
        "num_attention_heads": 2,
        "num_hidden_layers": 1,
        "pad_token_id": 0,
        "type_vocab_size": 2,
        "vocab_size": len(WORDS) + 16,
        "encoder_width": 1024,
        "add_cross_attention": True,
        "attention_probs_dropout_prob": 0.0,
        "hidden_dropout_prob": 0.0,
        "initializer_range": 0.02,
    }
    (tmp_path / "med_config.json").write_text(json.dumps(med))
    torch.save({}, tmp_path / "ImageReward.pt")
    torch.manual_seed(0)
    with pytest.raises(FileNotFoundError, match=r"vocab\.txt not found.*reward_models\.imagereward\.tokenizer_path"):
        build_reward(
            "imagereward",
            path=str(tmp_path / "ImageReward.pt"),
            med_config=str(tmp_path / "med_config.json"),
            tokenizer_path=str(tmp_path / "nowhere"),
        )
    scorer = build_reward(
        "imagereward",
        path=str(tmp_path / "ImageReward.pt"),
        med_config=str(tmp_path / "med_config.json"),
        batch_size=2,
        tokenizer_path=str(tmp_path / "tok"),
    )
    assert blip.BertTokenizer is original  # the redirect lasts for the load only
    assert scorer.model.blip.tokenizer.vocab_size == len((tmp_path / "tok" / "vocab.txt").read_text().split())
    x, prompts = images(2), PROMPTS[:2]
    s = scorer(x, prompts, [{}, {}])
    assert s.shape == (2,) and torch.isfinite(s).all()
    scorer.batch_size = 1
    torch.testing.assert_close(scorer(x, prompts, [{}, {}]), s, atol=1e-4, rtol=1e-4)
