"""VQA rewards: P(yes | "{phrase}?") for the prompt's noun phrases, with BLIP (T2I-CompBench) or GIT (T2I-R1)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from margrpo.prompts.analysis import _task_of, vqa_phrases
from margrpo.rewards.real._common import (
    _check_batch,
    _check_batch_size,
    _chunks,
    _dtype,
    _model_and_processor,
    _prepare_transformers,
    _to_pil,
)
from margrpo.rewards.registry import register_reward

VQA_REDUCTIONS = ("product", "mean")


class _PhraseVQA:
    """Yes-probability of "{phrase}?" for every noun phrase of the prompt, reduced per image.

    Subclasses implement `_yes_probability(images, owners, questions)`.
    """

    reward = "vqa"

    def __init__(
        self, reduce: str, skip_tasks: Sequence[str], max_phrases: int, device, batch_size: int, dtype: str = "float32"
    ):
        if reduce not in VQA_REDUCTIONS:
            raise ValueError(f"Unknown reduce: {reduce!r}; expected one of {VQA_REDUCTIONS}")
        if max_phrases < 1:
            raise ValueError(f"max_phrases={max_phrases} must be >= 1")
        self.reduce = reduce
        self.skip_tasks = {str(t).lower() for t in skip_tasks}
        self.max_phrases = int(max_phrases)
        self.device = torch.device(device)
        self.batch_size, self.dtype = _check_batch_size(batch_size), _dtype(dtype, self.reward)

    def _token_id(self, tokenizer, word: str) -> int:
        token_id = tokenizer.convert_tokens_to_ids(word)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"{self.reward}: the tokenizer has no token {word!r}; is this a VQA model's tokenizer?")
        return int(token_id)

    @torch.no_grad()
    def __call__(self, images: Tensor, prompts: list[str], metadata: list[dict]) -> Tensor:
        metadata = _check_batch(images, prompts, metadata)
        owners, questions = [], []
        skipped = []
        for i, (prompt, meta) in enumerate(zip(prompts, metadata)):
            if _task_of(meta) in self.skip_tasks:
                skipped.append(i)
                continue
            for phrase in vqa_phrases(prompt, meta, self.max_phrases):
                owners.append(i)
                questions.append(f"{phrase}?")
        asked = sorted(set(owners))  # only images with a question go through the model
        local = {i: k for k, i in enumerate(asked)}
        probs = torch.zeros(0)
        if questions:
            probs = self._yes_probability(_to_pil(images[asked]), [local[o] for o in owners], questions)
        scores = []
        for i in range(len(prompts)):
            p = probs[[k for k, o in enumerate(owners) if o == i]]
            if i in skipped:
                scores.append(0.0)  # T2I-R1: no VQA reward for these tasks
            elif p.numel() == 0:
                scores.append(1.0)  # nothing to ask (T2I-CompBench counts an empty question as 1)
            else:
                scores.append(float(p.prod() if self.reduce == "product" else p.mean()))
        return torch.tensor(scores, dtype=torch.float32)


@register_reward("vqa")
class BlipVQAReward(_PhraseVQA):
    """BLIP-VQA attribute binding, as T2I-CompBench scores color/shape/texture.

    For every noun phrase ("a green bench") the question "a green bench?" is answered; the
    probability of "yes" is p_yes / (p_yes + p_no) of the decoder's first answer token after
    [DEC] (T2I-CompBench's `vqa_prob`); the image scores the product over phrases (`reduce`).
    `path`: a BlipForQuestionAnswering folder (Salesforce/blip-vqa-capfilt-large is T2I-CompBench's
    model; blip-vqa-base also works); `processor_path` defaults to `path`.
    """

    reward = "vqa"

    def __init__(
        self,
        path: str,
        processor_path: str | None = None,
        reduce: str = "product",
        skip_tasks: Sequence[str] = (),
        max_phrases: int = 8,
        device: str = "cpu",
        batch_size: int = 16,
        dtype: str = "float32",
    ):
        super().__init__(reduce, skip_tasks, max_phrases, device, batch_size, dtype)
        _prepare_transformers()
        from transformers import AutoProcessor, BlipForQuestionAnswering

        source = "https://huggingface.co/Salesforce/blip-vqa-capfilt-large"
        model_dir, proc_dir = _model_and_processor(path, processor_path, self.reward, source)
        self.model = (
            BlipForQuestionAnswering.from_pretrained(model_dir, local_files_only=True)
            .eval()
            .to(self.device, self.dtype)
        )
        self.processor = AutoProcessor.from_pretrained(proc_dir, local_files_only=True)
        self.yes_id = self._token_id(self.processor.tokenizer, "yes")
        self.no_id = self._token_id(self.processor.tokenizer, "no")

    def _yes_probability(self, pil: list, owners: list[int], questions: list[str]) -> Tensor:
        m = self.model
        image_embeds = []
        for s in _chunks(len(pil), self.batch_size):
            pixels = self.processor.image_processor(images=pil[s], return_tensors="pt")["pixel_values"].to(
                self.device, self.dtype
            )
            image_embeds.append(m.vision_model(pixel_values=pixels)[0])  # [b, N, D]
        image_embeds = torch.cat(image_embeds)  # [B, N, D]
        # Questions are batched by token length, never padded: transformers' BLIP text decoder
        # (4.55) drops the encoder attention mask in its cross-attention, so padding would leak
        # into the answer; equal lengths give the unpadded result of the original BLIP code.
        ids = self.processor.tokenizer(questions)["input_ids"]
        by_length: dict[int, list[int]] = {}
        for k, row in enumerate(ids):
            by_length.setdefault(len(row), []).append(k)
        out = torch.zeros(len(questions))
        for members in by_length.values():
            for s in _chunks(len(members), self.batch_size):
                rows = members[s]
                input_ids = torch.tensor([ids[k] for k in rows], device=self.device)  # [q, L]
                img = image_embeds[torch.tensor([owners[k] for k in rows], device=self.device)]  # [q, N, D]
                img_mask = torch.ones(img.shape[:-1], dtype=torch.long, device=self.device)
                q_states = m.text_encoder(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    encoder_hidden_states=img,
                    encoder_attention_mask=img_mask,
                    return_dict=True,
                )[0]  # [q, L, D]
                bos = torch.full((len(rows), 1), m.decoder_start_token_id, dtype=torch.long, device=self.device)
                logits = m.text_decoder(
                    input_ids=bos,
                    encoder_hidden_states=q_states,
                    encoder_attention_mask=torch.ones_like(input_ids),
                    return_dict=True,
                ).logits[:, 0]
                prob = logits.float().softmax(-1)  # [q, V]
                out[rows] = (prob[:, self.yes_id] / (prob[:, self.yes_id] + prob[:, self.no_id])).cpu()
        return out


@register_reward("git_vqa")
class GitVQAReward(_PhraseVQA):
    """GIT VQA (T2I-R1's "git" reward, used by the MAR-GRPO paper's mixed reward).

    Input [CLS] + "{phrase}?" (no [SEP]); the next-token distribution gives P(yes) =
    p_yes / (p_yes + p_no); the image scores the mean over phrases (T2I-R1), with phrases from
    metadata `attr_nouns`/`nouns` or the prompt rules. Prompts whose task is in `skip_tasks`
    (T2I-R1: spatial, numeracy, left to the detector) score 0.
    `path`: a GitForCausalLM folder (microsoft/git-large-vqav2); `processor_path` defaults to `path`.
    """

    reward = "git_vqa"

    def __init__(
        self,
        path: str,
        processor_path: str | None = None,
        reduce: str = "mean",
        skip_tasks: Sequence[str] = ("spatial", "numeracy"),
        max_phrases: int = 8,
        device: str = "cpu",
        batch_size: int = 16,
        dtype: str = "float32",
    ):
        super().__init__(reduce, skip_tasks, max_phrases, device, batch_size, dtype)
        _prepare_transformers()
        from transformers import AutoModelForCausalLM, AutoProcessor

        source = "https://huggingface.co/microsoft/git-large-vqav2"
        model_dir, proc_dir = _model_and_processor(path, processor_path, self.reward, source)
        self.model = (
            AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).eval().to(self.device, self.dtype)
        )
        if type(self.model).__name__ != "GitForCausalLM":
            raise ValueError(f"git_vqa: {model_dir} holds a {type(self.model).__name__}, expected GitForCausalLM")
        self.processor = AutoProcessor.from_pretrained(proc_dir, local_files_only=True)
        tok = self.processor.tokenizer
        self.yes_id, self.no_id = self._token_id(tok, "yes"), self._token_id(tok, "no")
        self.cls_id, self.pad_id = tok.cls_token_id, tok.pad_token_id or 0

    def _yes_probability(self, pil: list, owners: list[int], questions: list[str]) -> Tensor:
        tok = self.processor.tokenizer
        pixels = torch.cat(
            [
                self.processor.image_processor(images=pil[s], return_tensors="pt")["pixel_values"]
                for s in _chunks(len(pil), self.batch_size)
            ]
        )  # [B, 3, h, w]
        ids = [[self.cls_id, *tok(q, add_special_tokens=False)["input_ids"]] for q in questions]
        out = []
        for s in _chunks(len(questions), self.batch_size):
            rows = ids[s]
            length = max(len(r) for r in rows)
            input_ids = torch.tensor([r + [self.pad_id] * (length - len(r)) for r in rows], device=self.device)
            mask = torch.tensor([[1] * len(r) + [0] * (length - len(r)) for r in rows], device=self.device)
            pv = pixels[torch.tensor(owners[s])].to(self.device, self.dtype)
            logits = self.model(pixel_values=pv, input_ids=input_ids, attention_mask=mask).logits  # [q, N_img + L, V]
            last = logits.shape[1] - length + torch.tensor([len(r) - 1 for r in rows], device=self.device)  # [q]
            prob = logits[torch.arange(len(rows), device=self.device), last].float().softmax(-1)  # [q, V]
            out.append((prob[:, self.yes_id] / (prob[:, self.yes_id] + prob[:, self.no_id])).cpu())
        return torch.cat(out)
