"""Pre-training of a toy MAR base policy and the head-only warm-up (design.md §3.11).

Both minimise MAR's loss: mask a random fraction of the tokens (truncated normal, mostly high
ratios, because generation starts from an almost empty canvas), run the AR model on the rest, and
train the head to denoise the masked tokens given their z. Warm-up is the same loop with only the
head's parameters in the optimiser.
"""

from __future__ import annotations

import csv
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from margrpo.infra.ema import EMA
from margrpo.infra.files import InputError, atomic_path, checked_path, spec_hash, verify_checksums
from margrpo.infra.runtime import PRECISIONS, autocast, warmup_cosine
from margrpo.policy.base import MARPolicy
from margrpo.policy.toy import mask_ratio_sample, masked_count

log = logging.getLogger(__name__)

BatchFn = Callable[[int, torch.Generator], tuple[Tensor, list[str]]]  # -> images [B, 3, H, W] in [0, 1], prompts


@dataclass
class PretrainConfig:
    steps: int = 1200
    batch_size: int = 64
    lr: float = 6e-4
    warmup_steps: int = 100  # linear LR warm-up, then cosine decay to 10%
    weight_decay: float = 0.02
    diffusion_batch_mul: int = 4  # noise draws per token per step: the head is cheap next to the transformer
    text_dropout: float = 0.1  # replace the prompt by the null prompt, for classifier-free guidance
    # mask ratio ~ normal(1, std) truncated to [min, 1]. MAR uses (0.7, 0.25); with 16 tokens the
    # last AR steps see most tokens known, and a model never trained there leaves ~25% of
    # single-object images empty (measured): (0.0, 1.0) trains every ratio, high ones still favoured
    mask_ratio_min: float = 0.0
    mask_ratio_std: float = 1.0
    head_steps: int | None = None  # freeze the head after this many steps (under-trained head, Harmon-like)
    train_ar: bool = True  # False = warm-up: only the head learns
    ema_decay: float = 0.995
    grad_clip: float = 1.0
    precision: str = "bf16"  # autocast dtype for forward passes on CPU/GPU ("no", "bf16")
    seed: int = 0
    save_every: int = 250  # resume checkpoints

    def __post_init__(self):
        if not 0 <= self.mask_ratio_min <= 1 or self.mask_ratio_std <= 0:
            raise ValueError(
                f"mask_ratio_min must lie in [0, 1] and mask_ratio_std be > 0, "
                f"got {self.mask_ratio_min}, {self.mask_ratio_std}"
            )
        if self.precision not in PRECISIONS:
            raise ValueError(f"Unknown precision: {self.precision!r}; expected 'no', 'bf16' or 'fp16'")


def mar_loss(
    policy: MARPolicy, sampler, images: Tensor, prompts: list[str], generator: torch.Generator, mul: int, ratio: float
) -> Tensor:
    """MAR's masked diffusion loss on one batch (mean over masked tokens and noise draws)."""
    tokens = policy.encode(images)  # [B, L, D]
    B, L, D = tokens.shape
    n_mask = masked_count(L, ratio)
    order = torch.argsort(torch.rand(B, L, generator=generator), dim=1).to(tokens.device)
    masked = torch.zeros(B, L, dtype=torch.bool, device=tokens.device).scatter_(1, order[:, :n_mask], True)
    z = policy.ar_forward(tokens, ~masked, policy.encode_prompts(prompts))  # [B, L, W]
    x0 = tokens[masked].repeat(mul, 1)  # [B*n_mask*mul, D]
    zm = z[masked].repeat(mul, 1)
    t = sampler.sample_train_time(len(x0), generator=generator).to(x0.device)
    noise = torch.randn(x0.shape, generator=generator).to(x0.device)
    x_t = sampler.add_noise(x0, noise, t)
    model_time = sampler.train_model_time(t)
    out = policy.head(x_t, model_time, zm)
    weight = policy.loss_weight(model_time) if hasattr(policy, "loss_weight") else 1.0
    return sampler.training_loss(out.float(), x0, noise, x_t, t, mse_weight=weight).mean()  # [n] -> mean


def train(
    policy: MARPolicy,
    batch_fn: BatchFn,
    cfg: PretrainConfig,
    state_dir: str | Path,
    log_path: str | Path | None = None,
    spec: dict | None = None,
) -> MARPolicy:
    """Train in place and return the EMA policy.

    Resumes from `state_dir/last.pt` only if it was written under the same spec: `cfg`, the
    policy's parameter shapes and `spec` (what the stage adds: data, model config). Otherwise it
    starts fresh and says why. `log_path` (CSV, one row per step) then holds exactly the steps
    of the state it continues from: no row twice after a kill.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    sampler = policy.make_sampler(num_steps=25)  # only the training-time methods are used
    params = _trainable(policy, cfg)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    ema = EMA(policy, cfg.ema_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    ckpt = state_dir / "last.pt"
    key = _spec_key(cfg, policy, spec)
    start = _resume(ckpt, key, policy, optimizer, ema, generator, cfg.steps)
    _trim_log(log_path, start)
    log_rows = []
    policy.train()
    t0 = time.time()
    bar = tqdm(
        range(start, cfg.steps),
        initial=start,
        total=cfg.steps,
        desc="pretrain" if cfg.train_ar else "warmup",
        mininterval=5,
    )
    for step in bar:
        _schedule(policy, optimizer, cfg, step)
        loss, grad_norm = _step(policy, sampler, batch_fn, cfg, optimizer, params, generator, step)
        ema.update(policy)
        log_rows.append(
            {
                "step": step + 1,
                "loss": loss.item(),
                "grad_norm": float(grad_norm),
                "lr": optimizer.param_groups[0]["lr"],
                "wall_time_s": time.time() - t0,
            }
        )
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        if (step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps:
            _append_log(log_path, log_rows)
            log_rows = []
            _save(ckpt, key, policy, optimizer, ema, generator, step + 1, cfg)
    ema.copy_to(policy)
    for p in policy.parameters():
        p.requires_grad_(True)
    policy.eval()
    return policy


def _spec_key(cfg: PretrainConfig, policy: MARPolicy, spec: dict | None) -> str:
    """The hash a checkpoint is written and resumed under: the config, the policy's parameter shapes and the
    stage's spec."""
    shapes = {k: list(v.shape) for k, v in policy.state_dict().items()}
    return spec_hash({"config": asdict(cfg), "shapes": shapes, "spec": spec})


def _trainable(policy: MARPolicy, cfg: PretrainConfig) -> list:
    """The parameters the optimizer steps: all of them, or for a head warm-up (train_ar off) the head's alone,
    everything else frozen."""
    params = list(policy.head_parameters()) if not cfg.train_ar else list(policy.parameters())
    if not cfg.train_ar:
        head = set(map(id, params))
        for p in policy.parameters():
            p.requires_grad_(id(p) in head)
    return params


def _schedule(policy: MARPolicy, optimizer, cfg: PretrainConfig, step: int) -> None:
    """What changes with the step: the learning rate (warm-up, then cosine to 10%) and, at head_steps, the
    head frozen for the rest of pre-training."""
    if cfg.head_steps is not None and step == cfg.head_steps and cfg.train_ar:
        for p in policy.head_parameters():
            p.requires_grad_(False)
    for group in optimizer.param_groups:
        group["lr"] = cfg.lr * warmup_cosine(step, cfg.steps, cfg.warmup_steps, floor=0.1)


def _save(
    ckpt: Path,
    key: str,
    policy: MARPolicy,
    optimizer,
    ema: EMA,
    generator: torch.Generator,
    step: int,
    cfg: PretrainConfig,
) -> None:
    """Write the training state after `step` steps under spec `key`, checksummed (what `_resume` reads)."""
    with checked_path(ckpt) as tmp:
        torch.save(
            {
                "model": policy.state_dict(),
                "optimizer": optimizer.state_dict(),
                "ema": ema.shadow,
                "generator": generator.get_state(),
                "step": step,
                "config": asdict(cfg),
                "spec_hash": key,
            },
            tmp,
        )


def _resume(
    ckpt: Path, key: str, policy: MARPolicy, optimizer, ema: EMA, generator: torch.Generator, steps: int
) -> int:
    """Load `ckpt` into the training objects if it was written under spec `key`, else delete it: the step to
    start from."""
    if not ckpt.exists():
        return 0
    try:
        verify_checksums(ckpt.parent, [ckpt.name])
        state = torch.load(ckpt, map_location=policy.device, weights_only=True)
        why = f"it was written under another spec ({state.get('spec_hash')}; this run: {key})"
    except InputError as err:  # changed or damaged since it was written
        state, why = {}, str(err)
    if state.get("spec_hash") != key:
        log.info("not resuming from %s: %s; starting fresh", ckpt, why)
        ckpt.unlink()
        return 0
    policy.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    ema.shadow = state["ema"]
    generator.set_state(state["generator"])
    log.info("resumed from %s at step %d of %d", ckpt, int(state["step"]), steps)
    return int(state["step"])


def _step(
    policy: MARPolicy,
    sampler,
    batch_fn: BatchFn,
    cfg: PretrainConfig,
    optimizer,
    params: list,
    generator: torch.Generator,
    step: int,
) -> tuple[Tensor, Tensor]:
    """One optimizer step on a fresh batch (prompts dropped for CFG, one mask ratio): (loss, grad norm)."""
    images, prompts = batch_fn(cfg.batch_size, generator)
    prompts = [("" if torch.rand((), generator=generator).item() < cfg.text_dropout else p) for p in prompts]
    ratio = mask_ratio_sample(generator, cfg.mask_ratio_min, std=cfg.mask_ratio_std)
    with autocast(policy.device, cfg.precision):
        loss = mar_loss(policy, sampler, images.to(policy.device), prompts, generator, cfg.diffusion_batch_mul, ratio)
    optimizer.zero_grad(set_to_none=True)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite pre-training loss at step {step}")
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in params if p.requires_grad], cfg.grad_clip)
    optimizer.step()
    return loss, grad_norm


def _trim_log(path, step: int) -> None:
    """Keep the log rows of steps <= `step` (those of the state training continues from), atomically."""
    if path is None or not Path(path).exists():
        return
    if step == 0:
        Path(path).unlink()
        return
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = [r for r in reader if int(r["step"]) <= step]
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=reader.fieldnames)
        w.writeheader()
        w.writerows(rows)


def _append_log(path, rows) -> None:
    if path is None or not rows:
        return
    path = Path(path)
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        if new:
            w.writeheader()
        w.writerows(rows)
