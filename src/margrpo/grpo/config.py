"""GRPOConfig: every knob of the GRPO trainer (design.md §3), validated where it is built."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from margrpo.infra.trackers import check_trackers
from margrpo.policy.settings import PolicySettings

# The string-valued knobs of GRPOConfig and their allowed values (the first is the paper's).
_CHOICES = {
    "kl": ("paper", "gaussian"),
    "logprob_cfg": ("exact", "cond_only"),
    "old_logprob": ("recorded", "recomputed"),
    "loss_tokens": ("completion", "committed"),
    "group_order": ("independent", "shared"),
    "group_noise": ("independent", "shared"),
    "advantages": ("group", "shuffled"),
}


@dataclass
class GRPOConfig:
    """Every knob of design.md §3. Defaults are the paper's where it states them."""

    steps: int = 60
    batch_prompts: int = 3  # prompts per rollout batch
    group_size: int = 4  # G images per prompt
    lr: float = 1e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_eps: float | None = 0.2  # None = no clipping
    beta: float = 0.01  # KL weight
    kl: str = "paper"  # "paper" (Eq. 14) or "gaussian" (exact KL of the two step Gaussians)
    mask_steps: int = 12  # |M| AR steps per rollout
    diffusion_steps: int = 10  # |T| diffusion steps per chosen AR step
    updates_per_rollout: int = 1
    # official code: no clip, the per-step losses of the |M| chosen AR steps summed (not averaged), one
    # optimizer step per rollout (nova trainer l. 690-740, 1025-1293)
    reinforce: bool = False
    logprob_cfg: str = "exact"  # "exact" or "cond_only"
    # "recorded": log_prob_old from the rollout record (exact in float32). "recomputed": a no-grad pass
    # of the training replay before the first update. Under bf16 the rollout and the batched replay
    # round differently, so recorded log-probs give ratios away from 1 at unchanged parameters;
    # recomputing makes the first update's ratio exactly 1 again (docs/findings.md, "What the RL defaults rest on").
    old_logprob: str = "recomputed"
    # Which tokens of a chosen AR step enter the loss. "completion" (paper / official code): every
    # still-unknown token. "committed": only the tokens committed at that step, the ones whose
    # samples reach the image; the others' samples are discarded, so their terms have zero mean
    # and only add variance (an unbiased variance reduction; it leaves +Sim nothing to filter).
    loss_tokens: str = "completion"
    # "independent" (paper): every image draws its own generation order. "shared": the G images of a
    # group share one order, so the group-mean baseline removes the reward variance the order causes
    # (docs/findings.md, "What the RL defaults rest on"); the policy gradient stays unbiased (the order
    # is not an action of the policy).
    group_order: str = "independent"
    # "independent" (paper): every token's initial diffusion noise is drawn per image. "shared": the
    # G images of a group start each token from the same noise (per prompt and position), so the
    # group baseline also removes the reward variance the unscored initial noise causes; what is left
    # within a group comes from the scored SDE steps (and the order, unless group_order is shared).
    group_noise: str = "independent"
    # "group": design.md §3.4. "shuffled": a no-signal control, the same advantages permuted over the batch's
    # images (its own stream), so a run moves the policy by update noise alone: beside a real run it tells
    # whether a change of reward comes from the reward's signal or from the updates' noise
    advantages: str = "group"
    micro_batches: int = 2  # per process: memory (gradient accumulation) and the gradient-variance probe's samples
    # the variance of the batch gradient across micro-batches (Fig. 2a / 5, logged as grad_var_ar): a probe that reads
    # `.grad` after every micro-batch and keeps one snapshot of it (grpo.grad_stats); the paper configs turn it off
    grad_variance: bool = True
    # memory: the chosen AR steps a micro-batch replays and backpropagates at once (None: all |M|). Activation
    # memory grows with it; the gradient is the same sum (float rounding aside)
    replay_chunk: int | None = None
    save_every: int = 20
    val_every: int = 10
    val_prompts: int = 24
    val_images: int = 1  # images per validation prompt, each from fixed noise: the same for every run
    max_nonfinite: int = 5
    # accelerate trackers, logging every step's metrics and a validation image grid to <out>/tb/ (wandb:
    # the wandb run); metrics.csv stays the report's source
    trackers: tuple[str, ...] = ("tensorboard",)
    ema_decay: float | None = None  # EMA of the trained parameters, for validation and the saved checkpoints
    # variant switches
    freeze_head: bool = False  # +Fix
    freeze_ar: bool = False  # the `head` variant (Appendix C.1 / Fig. 10): RL on the diffusion head alone
    trajectories: int = 1  # S (+MTE when > 1)
    top_frac: float = 0.3  # k: the fraction of the tokens predicted at a chosen step that Eq. 10 averages over S
    sim: bool = False  # +Sim
    tau: float = 0.0
    precision: str = "bf16"
    seed: int = 0

    def __post_init__(self):
        self.trackers = tuple(self.trackers)  # from JSON: a list
        check_trackers(self.trackers)
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in (0, 1) or null (no EMA), got {self.ema_decay}")
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"Unknown {name}: {getattr(self, name)!r}; expected one of {', '.join(map(repr, allowed))}"
                )
        if self.freeze_head and self.freeze_ar:
            raise ValueError("freeze_head and freeze_ar together leave nothing to train; set one of them")
        if self.trajectories < 1:
            raise ValueError("trajectories (S) must be >= 1; S = 1 turns MTE off")
        if not 0 <= self.top_frac <= 1:
            raise ValueError("top_frac (k) must be in [0, 1]")
        self._check_update_rule()
        if self.micro_batches < 1 or (self.batch_prompts * self.group_size) % self.micro_batches:
            raise ValueError(
                f"micro_batches ({self.micro_batches}) must divide the {self.batch_prompts * self.group_size} "
                "images of a batch"
            )
        if self.replay_chunk is not None and (isinstance(self.replay_chunk, bool) or self.replay_chunk < 1):
            raise ValueError(
                f"replay_chunk must be >= 1 (chosen AR steps per backward) or None (all), got {self.replay_chunk!r}"
            )
        if self.steps < 1 or self.batch_prompts < 1:
            raise ValueError(f"steps ({self.steps}) and batch_prompts ({self.batch_prompts}) must be >= 1")
        if self.group_size < 2:
            raise ValueError(f"group_size (G) must be >= 2, got {self.group_size}: a group of one has zero advantage")
        if math.isnan(self.tau) or not self.lr > 0:
            raise ValueError(f"tau must be a number (got {self.tau}) and lr > 0 (got {self.lr})")
        if (
            min(
                self.save_every,
                self.val_every,
                self.val_prompts,
                self.val_images,
                self.mask_steps,
                self.diffusion_steps,
            )
            < 1
        ):
            raise ValueError(
                "save_every, val_every, val_prompts, val_images, mask_steps and diffusion_steps must be >= 1"
            )

    def _check_update_rule(self) -> None:
        """The update's form: REINFORCE (no ratio, no clip, one step per rollout) or the clipped ratio against
        old log-probabilities that must match the replay's."""
        if self.reinforce and self.clip_eps is not None:
            self.clip_eps = None  # the official form has no clipping; say so in the resolved config
        if self.reinforce and self.updates_per_rollout != 1:
            raise ValueError(
                f"reinforce: true takes one optimizer step per rollout (the official update; without a ratio "
                f"later steps would be off-policy), got updates_per_rollout {self.updates_per_rollout}; set it to 1"
            )
        if self.old_logprob == "recorded" and self.logprob_cfg == "cond_only" and not self.reinforce:
            raise ValueError(
                "old_logprob: recorded with logprob_cfg: cond_only gives ratio != 1 from the first update "
                "(the rollout was guided, the replay is not), so the clip acts on a mismatch, not on "
                "policy change; set old_logprob: recomputed, or reinforce: true (no ratio)"
            )

    @classmethod
    def from_spec(cls, spec: dict, precision: str = "bf16") -> GRPOConfig:
        """Build from the `train_spec` dict the workflow passes (grpo section + variant switches).
        A key that is no field (a typo, a retired knob) is an error, not silently dropped."""
        names = {f.name for f in fields(cls)} - {"precision"}
        variant = {
            k: v for k, v in spec["variant"].items() if k not in ("name", "report_step")
        }  # not training settings
        unknown = sorted((set(spec["grpo"]) | set(variant)) - names)
        if unknown:
            raise ValueError(f"unknown GRPO setting(s) {unknown}; expected names from {', '.join(sorted(names))}")
        return cls(**{**spec["grpo"], **variant}, precision=precision)


def check_policy_settings(config: GRPOConfig, settings: PolicySettings) -> None:
    """A GRPO variant against the policy's settings it runs with (experiment.settings checks a run's spec with
    it before the policy loads; the trainer again, for trainers built by hand)."""
    if config.freeze_ar and settings.lora:
        raise ValueError("lora adapts the AR transformer, which freeze_ar leaves frozen; drop one of them")


def check_chosen_steps(config: GRPOConfig, ar_steps: int, stochastic: int) -> None:
    """|M| and |T| against the schedule's K AR steps and stochastic diffusion steps."""
    if config.mask_steps > ar_steps:
        raise ValueError(
            f"mask_steps |M| = {config.mask_steps} exceeds the {ar_steps} AR steps; lower grpo.mask_steps"
        )
    if config.diffusion_steps > stochastic:
        raise ValueError(
            f"diffusion_steps |T| = {config.diffusion_steps} exceeds the {stochastic} stochastic steps; "
            "lower grpo.diffusion_steps"
        )
