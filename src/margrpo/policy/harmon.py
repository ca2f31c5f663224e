"""Harmon-1.5B text-to-image as a MAR policy: our own implementation, state-dict compatible.

Harmon (Wu et al. 2025, github.com/wusize/Harmon) puts a Qwen2.5 LLM between the encoder and the
decoder of a MAR-H (github.com/LTH14/mar). One AR step reads, per image:

    known tokens --MAR encoder (+ 64 buffer slots holding `fake_latent`)--> x_enc
    [prompt embeddings, proj_in(x_enc) with the buffers moved last] --Qwen2 (causal)--> h
    x_enc + proj_out(h, buffers moved back first) --MAR decoder (mask tokens at unknown slots)--> z
    z --DiffLoss MLP (eps + learned-range variance, cosine DDPM)--> the head

The buffers go after the image tokens in the LLM because its attention is causal: only there do
they see every known token. Tokens are the KL-16 VAE latent (16 channels, stride 16) times 0.2325,
in raster order, one token per latent pixel (patch size 1). Harmon's positional embeddings were
learned on a 16x16 grid (256 px) and are resized bilinearly to the 32x32 grid of its 512 px
generation (1024 tokens), as its sampler does.

Prompt template (Harmon's config and text2image script): the user prompt becomes
"Generate an image: {prompt}" inside the chat turn
"<|im_start|>user\\n{input}<|im_end|>\\n<|im_start|>assistant\\n" (no system turn); the CFG branch
uses the bare message "Generate an image." in the same turn. Prompts are right-padded.

KV cache. Harmon's sampler computes the prompt's keys/values once and appends the image tokens
with the cache; its training pass runs prompt and image tokens in one forward. Under the causal
mask the prompt's states never depend on the image tokens, so both are the same function. We run
the one-pass form in every `ar_forward` (rollout and GRPO replay alike): one code path, the same
arithmetic in both (design.md §3.2, ratio == 1), and gradients reach the prompt's states too. The price
is recomputing ~30 prompt positions next to 64 buffers plus up to 1024 image tokens per call.

Only known tokens enter the encoder and the LLM (Harmon drops the masked ones), packed in raster
order. The GRPO replay stacks AR steps that know different numbers of tokens, so `ar_forward` runs
one pass per known count: no padding, and each row sees exactly the shapes it saw in the rollout.
That matters beyond speed: padding changes z in its last bits, which eps prediction amplifies at the
noisiest DDPM step enough to fail the ratio test of design.md §3.2 (docs/findings.md, "Harmon's packed tokens").

The folders it reads and writes (the `.pth` release, the transformers-format folder, a Hugging Face cache id)
are described in `margrpo.policy.harmon_files`; `save_pretrained` writes the release's layout.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import torch
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from margrpo.diffusion import DDPMConfig, DDPMSampler, Sampler
from margrpo.infra.files import atomic_path, atomic_write_json, record_checksums
from margrpo.policy.base import MARPolicy, TextCondition
from margrpo.policy.checkpointing import forward_mode, hf_checkpointing
from margrpo.policy.harmon_config import QWEN2_5_1_5B_INSTRUCT, HarmonConfig
from margrpo.policy.mar_h import MAR, build_mlp, build_vae, vae_key_to_ldm

CONFIG = "config.json"

# MAR's DiffLoss: 1000-step cosine process, eps prediction, learned-range variance (learn_sigma=True)
HEAD_PROCESS = DDPMConfig(num_train_steps=1000, noise_schedule="cosine", variance="learned_range", prediction="eps")


# ----------------------------------------------------------------------------------------------


class HarmonPolicy(MARPolicy):
    """Harmon-1.5B behind the MAR policy interface. Module names match the checkpoint:
    `llm` (Qwen2ForCausalLM), `mar`, `proj_in`, `proj_out`, and the frozen `vae`."""

    head_type = "ddpm"

    def __init__(self, config: HarmonConfig, tokenizer: PreTrainedTokenizerBase | None = None):
        super().__init__()
        c = self.config = config
        self.seq_len, self.token_dim, self.z_dim = c.grid**2, c.token_dim, c.decoder_width
        self.null_prompt = c.null_prompt
        self.tokenizer = tokenizer
        if tokenizer is not None:  # Harmon pads on the right; pads are masked out of every attention
            tokenizer.padding_side = "right"
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
        llm_config = Qwen2Config.from_dict(c.llm)
        llm_config._attn_implementation = c.attn_implementation
        self.llm = Qwen2ForCausalLM(llm_config)
        self.mar = MAR(c)
        hidden = llm_config.hidden_size
        self.proj_in = build_mlp(c.encoder_width, hidden, hidden)
        self.proj_out = build_mlp(hidden, hidden, c.encoder_width)
        self.vae = build_vae(c).requires_grad_(False)

    # --- conditioning ---------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> TextCondition:
        """The chat-templated "Generate an image: {prompt}" as LLM input embeddings [B, Lt, hidden]."""
        return self._embed([self.config.generation_template.format(text=p) for p in prompts])

    def null_condition(self, batch: int) -> TextCondition:
        """Harmon's CFG branch: the bare message "Generate an image." in the same chat turn."""
        return self._embed([self.null_prompt] * batch)

    def _embed(self, messages: list[str]) -> TextCondition:
        if self.tokenizer is None:
            raise ValueError("HarmonPolicy was built without a tokenizer; load it with from_pretrained or pass one")
        texts = [self.config.prompt_template.format(input=m) for m in messages]
        batch = self.tokenizer(texts, padding=True, return_tensors="pt")
        ids, mask = batch["input_ids"].to(self.device), batch["attention_mask"].to(self.device)
        return TextCondition(self.llm.get_input_embeddings()(ids), mask.bool())

    # --- AR model -------------------------------------------------------------------------------
    def ar_forward(self, tokens: Tensor, known_mask: Tensor, cond: TextCondition) -> Tensor:
        """z [B, L, Wd]: one pass per number of known tokens (see the module docstring)."""
        counts = known_mask.sum(1)  # [B]
        groups = [(counts == n).nonzero(as_tuple=True)[0] for n in counts.unique().tolist()]
        if len(groups) == 1:
            return self._ar_pass(tokens, known_mask, cond)
        z = torch.cat([self._ar_pass(tokens[g], known_mask[g], cond.index(g)) for g in groups])
        return z[torch.argsort(torch.cat(groups))]  # back to the input's row order

    def _ar_pass(self, tokens: Tensor, known_mask: Tensor, cond: TextCondition) -> Tensor:
        """Rows that all know the same number n of tokens."""
        B, L, D = tokens.shape
        nb, grid = self.config.buffer_size, self.config.grid
        # 1. the known tokens in raster order (Harmon drops the unknown ones)
        perm = torch.argsort((~known_mask).to(torch.uint8), dim=1, stable=True)  # [B, L], known positions first
        idx = perm[:, : int(known_mask[0].sum())]  # [B, n]
        x = tokens.gather(1, idx[..., None].expand(-1, -1, D))
        # 2. MAR encoder over [buffers, known tokens]
        h = self.mar.encode(x, idx, grid)  # [B, nb + n, We]
        # 3. LLM over [prompt, known tokens, buffers]: causal, so the buffers go last to see every token
        v = self.proj_in(h)
        seq = torch.cat([cond.hidden.to(v.dtype), v[:, nb:], v[:, :nb]], dim=1)
        attn = torch.cat([cond.mask, cond.mask.new_ones(B, v.shape[1])], dim=1)  # [B, Lt + n + nb]
        position_ids = (attn.long().cumsum(1) - 1).clamp(min=0)  # prompt padding takes no position
        with hf_checkpointing(self.llm, self.gradient_checkpointing):
            out = self.llm.model(
                inputs_embeds=seq, attention_mask=attn, position_ids=position_ids, use_cache=False
            ).last_hidden_state
        out = out[:, cond.hidden.shape[1] :]
        out = torch.cat([out[:, -nb:], out[:, :-nb]], dim=1)  # buffers back in front: [B, nb + n, hidden]
        # 4. residual back into MAR's width, then the decoder over all L positions
        return self.mar.decode(h + self.proj_out(out), perm, known_mask, grid)  # z [B, L, Wd]

    def head(self, x_t: Tensor, t: Tensor, z: Tensor) -> Tensor:
        """[eps, variance values] [N, 2D] of MAR's DiffLoss MLP at original timesteps t [N]."""
        return self.mar.diffloss.net(x_t, t, z)

    # --- codec: KL-16 latents, one token per latent pixel (patch_size 1) --------------------------
    def encode(self, images: Tensor) -> Tensor:
        """Images [B, 3, H, W] in [0, 1] -> posterior mean x vae_scale, as tokens [B, L, D] in raster order."""
        vae = self.vae
        latent = vae.encode((images * 2 - 1).to(vae.dtype)).latent_dist.mode() * self.config.vae_scale  # [B, C, h, w]
        p, g = self.config.patch_size, self.config.grid
        x = latent.reshape(-1, latent.shape[1], g, p, g, p).permute(0, 2, 4, 1, 3, 5)  # [B, g, g, C, p, p]
        return x.reshape(-1, g * g, self.token_dim)

    def decode(self, tokens: Tensor) -> Tensor:
        p, g = self.config.patch_size, self.config.grid
        C = self.config.vae_latent_channels
        latent = tokens.reshape(-1, g, g, C, p, p).permute(0, 3, 1, 4, 2, 5).reshape(-1, C, g * p, g * p)
        images = self.vae.decode((latent / self.config.vae_scale).to(self.vae.dtype)).sample
        return ((images.float() + 1) / 2).clamp(0, 1)

    @property
    def token_grid(self) -> tuple[int, int]:
        return (self.config.grid, self.config.grid)

    def make_sampler(self, num_steps: int, noise_level: float = 0.7) -> Sampler:
        """MAR's DDPM (cosine, eps, learned-range variance) respaced to num_steps; noise_level is flow-only."""
        return DDPMSampler(HEAD_PROCESS, num_steps=num_steps)

    # --- parameter groups ---------------------------------------------------------------------------
    def ar_parameters(self) -> Iterator[nn.Parameter]:
        """LLM, MAR encoder/decoder and the projectors: everything but the head and the frozen VAE."""
        return (p for n, p in self.named_parameters() if not n.startswith(("mar.diffloss.", "vae.")))

    def head_parameters(self) -> Iterator[nn.Parameter]:
        return self.mar.diffloss.parameters()

    lora_scope, lora_targets = r"llm\.model\.layers\.\d+\.", ("q_proj", "k_proj", "v_proj", "o_proj")

    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        """The Qwen2 layers (transformers' own checkpointing), MAR-H's encoder/decoder blocks and its diffusion head's
        residual blocks (which hold most of a replay's activations: every unknown token x diffusion steps x CFG)."""
        self.gradient_checkpointing = self.mar.gradient_checkpointing = (
            self.mar.diffloss.net.gradient_checkpointing
        ) = enabled
        if enabled:
            self.llm.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={
                    "use_reentrant": False,
                    "context_fn": functools.partial(forward_mode, self.llm),
                }
            )
        else:
            self.llm.gradient_checkpointing_disable()

    # --- checkpoints --------------------------------------------------------------------------------
    def harmon_state_dict(self) -> dict[str, Tensor]:
        """The state dict of Harmon's own weights file (`harmon_1.5b.pth`): everything but the VAE."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("vae.")}

    def vae_state_dict_ldm(self) -> dict[str, Tensor]:
        """The VAE's state dict under kl16.ckpt's LDM names (attention projections as 1x1 convs)."""
        levels = len(self.config.vae_channels)
        out = {}
        for k, v in self.vae.state_dict().items():
            if ".attentions." in k and k.endswith("weight") and v.dim() == 2:
                v = v[..., None, None]
            out[vae_key_to_ldm(k, levels)] = v
        return out

    def save_pretrained(self, directory: str | Path) -> None:
        """Write the checkpoint folder described in the module docstring (each file atomically)."""
        d, c = Path(directory), self.config

        def cpu(sd):
            return {k: v.detach().cpu().contiguous() for k, v in sd.items()}

        with atomic_path(d / c.weights_name) as tmp:
            torch.save(cpu(self.harmon_state_dict()), tmp)
        with atomic_path(d / c.vae_name) as tmp:
            torch.save({"model": cpu(self.vae_state_dict_ldm())}, tmp)
        llm_dir = d / c.llm_dir
        llm_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(llm_dir / "config.json", self.config.llm)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(llm_dir))
        settings = {
            f.name: getattr(c, f.name) for f in fields(c) if f.name != "llm"
        }  # the LLM's own config.json holds `llm`
        atomic_write_json(d / CONFIG, {"model_type": "harmon", **settings})
        record_checksums(d)  # checked on load

    @classmethod
    def from_pretrained(
        cls, local_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
    ) -> HarmonPolicy:
        """Load the `.pth` release layout above or the transformers-format Harmon-1_5B folder, from a path or a
        repository id in the Hugging Face cache (`harmon_files.load_harmon`); nothing is downloaded."""
        from margrpo.policy.harmon_files import load_harmon

        return load_harmon(cls, local_dir, device, dtype)


__all__ = ["HarmonConfig", "HarmonPolicy", "QWEN2_5_1_5B_INSTRUCT", "build_vae", "vae_key_to_ldm"]
