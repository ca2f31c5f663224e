"""MARVAL-RL on the toy: reward-gradient fine-tuning through the one-step generator.

Given the noise and the order, a one-step generation is a differentiable function of the parameters
(`generate_one_step` under gradients: each committed token feeds the next AR step), so the learned
reward's gradient reaches every parameter through the image, as in MARVAL-RL (Gu et al. 2025), which
fine-tunes the distilled generator by reward feedback.

The toy's mixed reward = toyclip (differentiable) + shapes (the exact parser; not differentiable).
How each term enters the gradient:
- toyclip: pathwise, -w_clip * mean cos(image, prompt) backpropagated through toyclip's image tower,
  the pixel decoder, the one-step head and the AR transformer;
- shapes, `shapes_grad="reinforce"`: a score-function term on the one-step policy's exact Gaussian
  log-prob, -w_shapes * mean_i A_i * log pi(tokens_i) / L, with A_i the GRPO group advantage of the
  shapes score (G images per prompt) and log pi replayed with the generated tokens as fixed context
  (`committed_log_prob`); divided by L (tokens) to match the GRPO trainer's per-token scale.
  `shapes_grad="none"`: the shapes term is scored and logged but sends no gradient.
- optional regulariser (`reg_weight` > 0): MARVAL's distillation loss toward the teacher's CFG
  distribution at this batch's contexts, with the fake score head updated alternately (DI*-style
  regularised reward fine-tuning; our addition, off by default: the paper's exact RL regulariser is
  not known to us).
Metric rows use the GRPO trainer's metrics.csv names where they apply.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch

from margrpo.grpo.checkpoints import Part
from margrpo.grpo.objective import group_advantages
from margrpo.grpo.rollout import SamplingConfig
from margrpo.grpo.validation import RewardFn, validation_batch
from margrpo.policy.toy import ToyMAR
from margrpo.prompts.suites import PromptSet
from margrpo.related.marval.distill import MARVALDistiller, draw_rows
from margrpo.related.marval.one_step import OneStepRollout, committed_log_prob, generate_one_step
from margrpo.related.method import RelatedTrainer

log = logging.getLogger(__name__)
SHAPES_GRADS = ("reinforce", "none")
TRAINED = ("all", "head")


@dataclass
class MARVALRLConfig:
    steps: int = 50
    batch_prompts: int = 4
    group_size: int = 4  # G images per prompt (the REINFORCE term's group baseline)
    lr: float = 1e-5
    toyclip_weight: float = 1.0
    shapes_weight: float = 1.0
    shapes_grad: str = "reinforce"  # "reinforce" (score function on the one-step log-prob) or "none" (scored only)
    reg_weight: float = 0.0  # weight of the distillation regulariser toward the teacher (needs a distiller)
    reg_rows: int = 256
    trained: str = "all"  # "all": AR transformer + head (text encoder frozen, as in GRPO); "head": the head only
    grad_clip: float = 1.0
    val_every: int = 10
    val_prompts: int = 16
    seed: int = 0

    def __post_init__(self):
        if self.shapes_grad not in SHAPES_GRADS:
            raise ValueError(f"Unknown shapes_grad: {self.shapes_grad!r}; expected one of {SHAPES_GRADS}")
        if self.trained not in TRAINED:
            raise ValueError(f"Unknown trained: {self.trained!r}; expected one of {TRAINED}")
        if self.group_size < 2 and self.shapes_grad == "reinforce" and self.shapes_weight:
            raise ValueError(
                "group_size must be >= 2 for the REINFORCE term's group baseline; or set shapes_grad: none"
            )
        if (
            min(self.steps, self.batch_prompts, self.group_size, self.val_every, self.val_prompts) < 1
            or not self.lr > 0
        ):
            raise ValueError("steps, batch_prompts, group_size, val_every and val_prompts must be >= 1, and lr > 0")


def clip_scores(clip, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """toyclip's cosine [B], differentiable in the images (the text side needs no gradient)."""
    with torch.no_grad():
        text = clip.encode_text(prompts)
    return (clip.encode_images(images.clamp(0, 1)) * text).sum(-1)


class MARVALRL(RelatedTrainer):
    """Reward-gradient fine-tuning of a one-step policy, as the run loop's `Method` (related.method). `clip`: a
    ToyClip model; `shapes`: a ShapesReward or None; `val_reward`: the reward validation scores (the stage's reward
    mix, as `margrpo train` validates; None: this method's weighted sum of its terms)."""

    def __init__(
        self,
        policy: ToyMAR,
        clip,
        shapes,
        train_prompts: PromptSet,
        val_prompts: PromptSet,
        sampling: SamplingConfig,
        config: MARVALRLConfig,
        distiller: MARVALDistiller | None = None,
        val_reward: RewardFn | None = None,
    ):
        if policy.config.head_sampler != "one_step":
            raise ValueError(
                "MARVAL-RL trains a one-step policy (head_sampler: one_step); distil one with MARVALDistiller"
            )
        if config.reg_weight and (distiller is None or distiller.student is not policy):
            raise ValueError("reg_weight > 0 needs a MARVALDistiller whose student is this policy")
        self.clip, self.shapes, self.distiller = clip.requires_grad_(False).eval(), shapes, distiller
        self.train_prompts, self.val_prompts, self.sampling = train_prompts, val_prompts, sampling
        self.val_reward = val_reward or self.total_reward
        policy.requires_grad_(False)
        params = list(policy.head_parameters()) + (list(policy.ar_parameters()) if config.trained == "all" else [])
        self.params = [p.requires_grad_(True) for p in params]
        optimizer = torch.optim.AdamW(self.params, lr=config.lr, weight_decay=0.0)
        parts = None
        if config.reg_weight:  # the regulariser's fake score head, its optimizer and its draws go on where they were
            parts = {"distiller": Part(distiller.fake, distiller.fake_opt, {"generator": distiller.generator})}
        super().__init__(policy, optimizer, config, "marval-rl", parts)

    def rewards(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> dict[str, torch.Tensor]:
        """Each reward term [N] (toyclip with gradients to the images) and their weighted sum, detached."""
        terms = {"toyclip": clip_scores(self.clip, images, prompts)}
        if self.shapes is not None:
            terms["shapes"] = self.shapes(images.detach(), prompts, metadata)
        total = self.cfg.toyclip_weight * terms["toyclip"].detach()
        if "shapes" in terms:
            total = total + self.cfg.shapes_weight * terms["shapes"]
        return {**terms, "total": total}

    def loss(self, rollout: OneStepRollout, terms: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        """The reward-gradient loss of one batch and its parts (see the module docstring)."""
        cfg = self.cfg
        parts = {"reward_loss": -cfg.toyclip_weight * terms["toyclip"].mean()}
        if "shapes" in terms and cfg.shapes_grad == "reinforce" and cfg.shapes_weight:
            adv, _ = group_advantages(terms["shapes"], cfg.group_size)
            log_prob = committed_log_prob(self.policy, rollout, self.sampling.temperature) / self.policy.seq_len
            parts["reinforce_loss"] = -cfg.shapes_weight * (adv.to(log_prob.device) * log_prob).mean()
        if cfg.reg_weight:
            rows = draw_rows(rollout, cfg.reg_rows, self.distiller.generator)
            parts["fake_loss"] = torch.tensor(self.distiller.fake_update(rows))
            parts["reg_loss"] = cfg.reg_weight * self.distiller.student_loss(rows)
        total = sum(v for k, v in parts.items() if k != "fake_loss")
        return total, {k: v.item() for k, v in parts.items()}

    def train_step(self) -> dict:
        """One update: differentiable generation -> rewards -> loss -> clipped optimizer step."""
        t0, cfg = time.time(), self.cfg
        g = torch.Generator().manual_seed((cfg.seed * 1_000_003 + self.step) * 16)  # a resumed run draws the same
        idx = torch.randperm(len(self.train_prompts), generator=g)[: cfg.batch_prompts].tolist()
        prompts = [self.train_prompts.prompts[i] for i in idx]
        meta = [self.train_prompts.metadata[i] for i in idx for _ in range(cfg.group_size)]
        self.policy.eval()  # dropout off: the loss is that of the sampling policy
        rollout = generate_one_step(
            self.policy,
            prompts,
            self.sampling,
            group_size=cfg.group_size,
            generator=g,
            with_uncond=bool(cfg.reg_weight),
        )
        terms = self.rewards(rollout.images, rollout.prompts, meta)
        loss, parts = self.loss(rollout, terms)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, cfg.grad_clip).item()
        skipped = not (math.isfinite(loss.item()) and math.isfinite(grad_norm))
        if not skipped:
            self.optimizer.step()
        self.step += 1  # the run loop's one counter (RunState)
        total = terms["total"]
        return {
            "step": self.step,
            "reward_mean": total.mean().item(),
            "reward_std": total.std().item(),
            **{f"reward/{k}": v.detach().mean().item() for k, v in terms.items() if k != "total"},
            "loss": loss.item(),
            **parts,
            "grad_norm": grad_norm,
            "skipped": int(skipped),
            "lr": self.optimizer.param_groups[0]["lr"],
            "step_time_s": time.time() - t0,
        }

    def total_reward(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]):
        """The weighted sum of the reward terms [N] and each term, as a reward mix returns them."""
        terms = self.rewards(images, prompts, metadata)
        return terms.pop("total"), terms

    def validate(self) -> list[float]:
        """Each validation prompt's reward as `margrpo train` validates (grpo.validation: the noise of VAL_SEED and
        the batch's offset), so GRPO on the same one-step base shares its base scores (paired across runs)."""
        n = min(self.cfg.val_prompts, len(self.val_prompts))
        return [
            x
            for a in range(0, n, 8)
            for x in validation_batch(self.policy, self.val_reward, self.val_prompts, a, n, self.sampling, 1, "no")[0]
        ]
