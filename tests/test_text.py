"""The toy text stack: the word-level tokenizer (margrpo.policy.text) and the tiny TextEncoder (policy/layers.py)."""

import pytest
import torch
import torch.nn.functional as F

from margrpo.infra.files import InputError
from margrpo.policy.layers import TextEncoder
from margrpo.policy.text import WordTokenizer, build_tokenizer


def test_tokenizer_pads_truncates_and_round_trips(tmp_path):
    tok = build_tokenizer(["a", "Red", "circle"])  # ids: [PAD] 0, [UNK] 1, [CLS] 2, a 3, circle 4, red 5
    batch = tok(["A red circle", "", "a b c d e f"], max_length=5)
    assert batch["input_ids"].tolist() == [[2, 3, 5, 4, 0], [2, 0, 0, 0, 0], [2, 3, 1, 1, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    assert len(tok) == 6 and tok([], max_length=5)["input_ids"].shape == (0, 0)
    tok.save_pretrained(tmp_path / "tokenizer")
    again = WordTokenizer.from_pretrained(tmp_path / "tokenizer")
    assert again(["red circle x"], max_length=8)["input_ids"].tolist() == [[2, 5, 4, 1]]


def test_a_missing_or_unreadable_tokenizer_names_its_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nowhere'}: not a tokenizer folder"):
        WordTokenizer.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "tokenizer.json").write_text("{truncated")
    with pytest.raises(InputError, match=f"{tmp_path / 'tokenizer.json'}: unreadable tokenizer"):
        WordTokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize("relative", [False, True])
@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
)
def test_text_encoder_ignores_padding(relative, device):
    """Padding keys are masked out (on cuda: the relative bias and the mask as one float mask)."""
    torch.manual_seed(0)
    enc = TextEncoder(vocab_size=10, width=16, depth=2, heads=2, max_len=8, relative=relative).eval()
    if relative:
        torch.nn.init.normal_(enc.relative_bias)
    cpu_out = enc(torch.tensor([[2, 5, 7]]), torch.ones(1, 3, dtype=torch.long))
    enc.to(device)
    ids, mask = torch.tensor([[2, 5, 7]], device=device), torch.ones(1, 3, dtype=torch.long, device=device)
    padded = enc(F.pad(ids, (0, 3)), F.pad(mask, (0, 3)))  # [1, 6, 16]
    torch.testing.assert_close(padded[:, :3], enc(ids, mask))
    torch.testing.assert_close(padded[:, :3].cpu(), cpu_out, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="exceed max_len=8"):
        enc(torch.zeros(1, 9, dtype=torch.long, device=device), torch.ones(1, 9, device=device))
