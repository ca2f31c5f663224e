"""GRPO for the discrete toy-mask policy: plain GRPO with exact log-probs, and MaskGRPO.

Both share the group advantages, the clipped surrogate and the KL of `grpo.objective`; they differ in
which tokens are scored and given what.

**Plain GRPO** (`method: grpo`). The rollout record (`rollout.MaskRollout`) gives, for every
unmasking step k, the state the step saw and the tokens it committed. The log-prob of a committed
token is its exact categorical log-prob given that state, recomputed with gradients for the chosen
steps in one batched pass; with random selection their sum is the exact log-likelihood of the
trajectory up to a parameter-free term. The loss is the clipped surrogate averaged over every
committed token of the chosen steps (all K by default: every token of the image counts once).

**MaskGRPO** (`method: mask_grpo`; Ma et al., "Consolidating Reinforcement Learning for Multimodal
Discrete Diffusion Models", arXiv 2510.02880; read from the paper's abstract and its official code,
grpo/mask_grpo_trainer.py, `remask_t2i` / `_get_per_token_logps_uni` / `compute_loss`). The
likelihood of a finished image x0 under a masked-token model is intractable; its evidence lower bound
is E_r E_{x_r ~ q(.|x0, r)} [ (1/r) sum_{j masked in x_r} log p(x0_j | x_r, c) ], where q masks each
token independently with probability r. MaskGRPO's importance estimator takes one draw of it per
update: re-mask the finished image at ratio r (the same draw for the current, old and reference
policy) and use, for every re-masked token j, the ratio p_theta(x0_j | x_r, c) / p_old(x0_j | x_r, c)
in the clipped surrogate, averaged over the re-masked tokens (the 1/r weight is a constant of the
draw and drops out of the token mean). For images the ratio is "high-truncated": over the mu updates
of one rollout batch, r_i = min(r_min + (1 - r_min) i / mu, 0.999), i = 1..mu, r_min = 0.6 in the
official T2I script, one optimizer step per r_i with a fresh draw. The KL to the reference is the
k3 estimator exp(d) - d - 1, d = log p_ref - log p_theta, on the same tokens (as the official code);
`kl: exact` swaps in the exact categorical KL at those positions. Where the ELBO is exact, one masked
token whose context is the rest of the image, this ratio equals the exact one (tested).

What is ours, not the paper's: the official rollout for images is its "emerge" sampler (each masked
token unmasked with probability (k_t - k_s) / k_t per step); ours commits a fixed cosine-scheduled
count at random positions (`MaskSamplingConfig.selection: random`), which is the same kind of
parameter-free unmasking with a deterministic count. CFG is u + s (c - u) on the logits in the
rollout and (`logprob_cfg: exact`, default) in every log-prob pass (the official code uses MUSE's
(1 + s) c - s u: s shifted by one). The official training pass scores the conditional branch alone
(its CFG is commented out, mask_grpo_trainer.py l. 664-686): `logprob_cfg: cond_only` does that.
Both are self-consistent, as every log-prob (new, old, reference) comes from the same pass: they
differ in which policy is trained, the guided one that generates or the conditional one.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from margrpo.grpo.objective import group_advantages, masked_mean, per_token_policy_objective, policy_ratio_stats
from margrpo.grpo.random_streams import VAL_SEED, step_generator
from margrpo.grpo.run_files import step_row
from margrpo.policy.base import deterministic
from margrpo.prompts.suites import PromptSet
from margrpo.related.maskgrpo.policy import ToyMaskPolicy
from margrpo.related.maskgrpo.rollout import MaskGITSampler, MaskRollout, MaskSamplingConfig, conditions, generate
from margrpo.related.method import RelatedTrainer
from margrpo.rewards.registry import RewardFn

METHODS, KLS, LOGPROB_CFGS = ("grpo", "mask_grpo"), ("k3", "exact"), ("exact", "cond_only")


@dataclass
class MaskGRPOConfig:
    """The knobs of both methods. Defaults follow the MAR trainer's toy settings and MaskGRPO's T2I script."""

    method: str = "grpo"  # "grpo" (exact log-probs of the committed tokens) or "mask_grpo" (ELBO importance estimator)
    steps: int = 60
    batch_prompts: int = 3  # prompts per rollout batch
    group_size: int = 4  # G images per prompt
    lr: float = 1e-4
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    clip_eps: float = 0.2
    beta: float = 0.01  # KL weight; 0 = no reference model
    kl: str = "k3"  # "k3" (the official estimator on the scored tokens) or "exact" (categorical KL there)
    iterations: int = 4  # mu: optimizer steps per rollout batch (MaskGRPO: one re-mask ratio each; official T2I: 6)
    # grpo: |M| of the K unmasking steps scored per update, drawn uniformly, as grpo.mask_steps (1 <= |M| <= K);
    # 8: every step of the default K = 8
    mask_steps: int = 8
    min_mask_ratio: float = 0.6  # mask_grpo: r_min of the high-truncated re-mask ratios (official T2I script)
    # "exact": log-probs under the rollout's guidance; "cond_only": the conditional branch alone, as the official
    # training pass (mask_grpo_trainer.py l. 664-686, CFG commented out)
    logprob_cfg: str = "exact"
    val_every: int = 10
    val_prompts: int = 24
    seed: int = 0

    def __post_init__(self):
        for name, allowed in (("method", METHODS), ("kl", KLS), ("logprob_cfg", LOGPROB_CFGS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"Unknown {name}: {getattr(self, name)!r}; expected one of {', '.join(map(repr, allowed))}"
                )
        if self.group_size < 2:
            raise ValueError(f"group_size (G) must be >= 2, got {self.group_size}: a group of one has zero advantage")
        if (
            min(self.steps, self.batch_prompts, self.iterations, self.val_every, self.val_prompts) < 1
            or not self.lr > 0
        ):
            raise ValueError("steps, batch_prompts, iterations, val_every and val_prompts must be >= 1 and lr > 0")
        if not 0 <= self.min_mask_ratio < 1 or self.clip_eps < 0 or self.beta < 0:
            raise ValueError("min_mask_ratio must lie in [0, 1), clip_eps and beta be >= 0")
        if self.mask_steps < 1:
            raise ValueError(f"mask_steps |M| must be >= 1, got {self.mask_steps}")


# --------------------------------------------------------------------------------------------
# log-probs: one batched pass for any set of (state, scored tokens)
# --------------------------------------------------------------------------------------------


def token_log_probs(
    policy: ToyMaskPolicy,
    prompts: list[str],
    tokens: Tensor,
    masked: Tensor,
    sampling: MaskSamplingConfig,
    logprob_cfg: str = "exact",
) -> tuple[Tensor, Tensor]:
    """log p(tokens_j | state) at every position j for M states at once, in one pass (two with CFG).

    tokens [N, L] finished images; masked [M, N, L] bool: state m shows `tokens` where False and
    [MASK] where True. The categorical is the rollout's: guided logits over the temperature
    (`logprob_cfg="cond_only"`: the conditional logits, as the official training pass).
    Returns (log-probs of the tokens [M, N, L], full log-probs [M, N, L, V]), float32, with gradients.
    """
    if logprob_cfg == "cond_only":
        sampling = replace(sampling, cfg_scale=1.0)
    M, N, L = masked.shape
    states = torch.where(masked, policy.mask_id, tokens).reshape(M * N, L)  # [M*N, L]
    with deterministic(policy):
        cond, uncond = conditions(policy, prompts, sampling)
        logits = policy.guided_logits(
            states, cond.tile(M), None if uncond is None else uncond.tile(M), sampling.cfg_scale
        )
    logp = MaskGITSampler(policy.seq_len, sampling).log_probs(logits)  # [M*N, L, V]
    lp = logp.gather(-1, tokens.repeat(M, 1)[..., None]).squeeze(-1)  # [M*N, L]
    return lp.view(M, N, L), logp.view(M, N, L, -1)


def recorded_log_probs(rollout: MaskRollout, steps: Tensor) -> Tensor:
    """The rollout's own log-probs of the tokens committed at `steps` [M]: [M, N, L] (0 elsewhere)."""
    return torch.where(rollout.committed[steps], rollout.log_probs[steps], torch.zeros_like(rollout.log_probs[steps]))


def mask_ratios(iterations: int, min_ratio: float) -> list[float]:
    """MaskGRPO's high-truncated re-mask ratios of the mu updates of one batch: r_min + (1 - r_min) i / mu, capped."""
    return [min(min_ratio + (1 - min_ratio) * (i + 1) / iterations, 0.999) for i in range(iterations)]


def remask(tokens: Tensor, ratio: float, generator: torch.Generator | None = None) -> Tensor:
    """A draw of the forward process q(x_r | x0): each token masked with probability `ratio`, [N, L] bool.
    An image left without a masked token gets one at a uniform position (the estimator needs a token)."""
    N, L = tokens.shape
    masked = (torch.rand(N, L, generator=generator) < ratio).to(tokens.device)
    one = torch.zeros_like(masked).scatter_(1, torch.randint(L, (N, 1), generator=generator).to(tokens.device), True)
    return torch.where(masked.any(1, keepdim=True), masked, one)


@dataclass
class Target:
    """What one update scores: the states (masked [M, N, L]) and which tokens count (weights [M, N, L])."""

    masked: Tensor
    weights: Tensor


def plan_targets(cfg: MaskGRPOConfig, rollout: MaskRollout, generator: torch.Generator) -> list[Target]:
    """One target per update: GRPO's chosen unmasking steps and their committed tokens, or MaskGRPO's re-masks."""
    K = rollout.masked.shape[0]
    targets = []
    for ratio in mask_ratios(cfg.iterations, cfg.min_mask_ratio):
        if cfg.method == "grpo":
            if cfg.mask_steps > K:
                raise ValueError(f"mask_steps |M| = {cfg.mask_steps} exceeds the {K} unmasking steps: lower it")
            steps = torch.randperm(K, generator=generator)[: cfg.mask_steps].sort().values
            targets.append(Target(rollout.masked[steps], rollout.committed[steps]))
        else:
            masked = remask(rollout.tokens, ratio, generator)[None]  # [1, N, L]
            targets.append(Target(masked, masked))
    return targets


def kl_terms(lp: Tensor, logp: Tensor, ref_lp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    """Per scored token: k3 = exp(d) - d - 1 with d = log p_ref - log p (the GRPO / official MaskGRPO
    estimator), or the exact KL(p || p_ref) of the two categoricals at that position."""
    if kind == "k3":
        d = ref_lp - lp
        return torch.exp(d) - d - 1
    return (logp.exp() * (logp - ref_logp)).sum(-1)


def surrogate_loss(
    cfg: MaskGRPOConfig,
    lp: Tensor,
    logp: Tensor,
    old: Tensor,
    ref: tuple[Tensor, Tensor] | None,
    adv: Tensor,
    weights: Tensor,
) -> tuple[Tensor, dict]:
    """-(token mean of the clipped surrogate) + beta * (token mean of the KL), over the scored tokens."""
    obj = per_token_policy_objective(lp, old, adv, cfg.clip_eps)  # [M, N, L]
    policy_term = -masked_mean(obj, weights)
    kl_term = masked_mean(kl_terms(lp, logp, *ref, cfg.kl), weights) if ref is not None else torch.zeros(())
    stats = policy_ratio_stats(lp, old, adv, weights, cfg.clip_eps)
    stats.update(policy_loss=policy_term.item(), kl=kl_term.item())
    return policy_term + cfg.beta * kl_term, stats


# --------------------------------------------------------------------------------------------
# a step, the validation, the run
# --------------------------------------------------------------------------------------------


@dataclass
class ScoredBatch:
    rollout: MaskRollout
    rewards: Tensor  # [N]
    components: dict[str, Tensor]  # each reward term [N]
    adv: Tensor  # [N]
    frac_zero: float


def rollout_and_score(
    policy: ToyMaskPolicy,
    reward_fn: RewardFn,
    prompts: PromptSet,
    cfg: MaskGRPOConfig,
    sampling: MaskSamplingConfig,
    step: int,
) -> ScoredBatch:
    """Sample prompts, generate their groups, score them, and normalise the rewards within each group."""
    g_prompts, g_roll = step_generator(cfg.seed, step, 0), step_generator(cfg.seed, step, 1)
    idx = torch.randperm(len(prompts), generator=g_prompts)[: cfg.batch_prompts].tolist()
    meta = [prompts.metadata[i] for i in idx for _ in range(cfg.group_size)]
    rollout = generate(policy, [prompts.prompts[i] for i in idx], sampling, cfg.group_size, g_roll)
    rewards, components = reward_fn(rollout.images, rollout.prompts, meta)
    adv, frac_zero = group_advantages(rewards, cfg.group_size)
    return ScoredBatch(rollout, rewards, components, adv, frac_zero)


def update(
    policy: ToyMaskPolicy,
    ref: ToyMaskPolicy | None,
    optimizer,
    params: list,
    cfg: MaskGRPOConfig,
    batch: ScoredBatch,
    target: Target,
    old: Tensor | None,
) -> dict:
    """One optimizer step on one target; `old` None: the parameters are still the rollout's, so this
    pass's own log-probs (detached) are log_prob_old. A non-finite loss or gradient skips the step."""
    r = batch.rollout
    lp, logp = token_log_probs(policy, r.prompts, r.tokens, target.masked, r.sampling, cfg.logprob_cfg)
    ref_terms = None
    if ref is not None:
        with torch.no_grad():
            ref_terms = token_log_probs(ref, r.prompts, r.tokens, target.masked, r.sampling, cfg.logprob_cfg)
    loss, stats = surrogate_loss(
        cfg, lp, logp, lp.detach() if old is None else old, ref_terms, batch.adv, target.weights
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
    finite = math.isfinite(loss.item()) and math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    stats.update(grad_norm_ar=grad_norm, skipped=int(not finite), mask_frac=float(target.masked.float().mean()))
    return stats


def train_step(
    policy: ToyMaskPolicy,
    ref: ToyMaskPolicy | None,
    optimizer,
    params: list,
    reward_fn: RewardFn,
    prompts: PromptSet,
    cfg: MaskGRPOConfig,
    sampling: MaskSamplingConfig,
    step: int,
) -> dict:
    """Rollout -> rewards -> advantages -> mu updates (log_prob_old of all taken before the first) -> a metrics row."""
    t0 = time.time()
    batch = rollout_and_score(policy, reward_fn, prompts, cfg, sampling, step)
    r = batch.rollout
    targets = plan_targets(cfg, r, step_generator(cfg.seed, step, 2))
    with torch.no_grad():  # the first update reads log_prob_old off its own pass
        olds = [None] + [
            token_log_probs(policy, r.prompts, r.tokens, t.masked, sampling, cfg.logprob_cfg)[0] for t in targets[1:]
        ]
    logs = [update(policy, ref, optimizer, params, cfg, batch, t, old) for t, old in zip(targets, olds)]

    def mean(k):
        return sum(s[k] for s in logs) / len(logs)

    updates = {k: mean(k) for k in ("policy_loss", "kl", "clip_frac", "ratio_mean", "grad_norm_ar", "mask_frac")}
    updates.update(
        ratio_min=min(s["ratio_min"] for s in logs),
        ratio_max=max(s["ratio_max"] for s in logs),
        skipped=sum(s["skipped"] for s in logs),
    )
    lr = optimizer.param_groups[0]["lr"]
    return step_row(
        step + 1, batch.rewards, batch.components, batch.adv, batch.frac_zero, updates, lr, time.time() - t0
    )


@torch.no_grad()
def validate_scores(
    policy: ToyMaskPolicy, reward_fn: RewardFn, prompts: PromptSet, sampling: MaskSamplingConfig, n: int
) -> list[float]:
    """Reward of one image for each of the first `n` prompts, from fixed noise (VAL_SEED: the same draw for
    every run, method and step, so differences between them are paired)."""
    n = min(n, len(prompts))
    r = generate(policy, prompts.prompts[:n], sampling, 1, torch.Generator().manual_seed(VAL_SEED))
    return reward_fn(r.images, r.prompts, prompts.metadata[:n])[0].tolist()


def prepare(policy: ToyMaskPolicy, config: MaskGRPOConfig) -> tuple[ToyMaskPolicy | None, torch.optim.Optimizer, list]:
    """(reference, optimizer, trained parameters) of a run: the text encoder frozen (as in the MAR trainer),
    the reference a frozen copy of the policy as it is now (None when beta = 0), AdamW over the rest."""
    for name, p in policy.named_parameters():
        p.requires_grad_(not name.startswith("text_encoder."))
    params = [p for p in policy.parameters() if p.requires_grad]
    ref = copy.deepcopy(policy).requires_grad_(False).eval() if config.beta > 0 else None
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.999), weight_decay=config.weight_decay)
    return ref, optimizer, params


class MaskGRPOTrainer(RelatedTrainer):
    """Plain GRPO or MaskGRPO (`config.method`) on `policy`, in place, as the run loop's `Method` (related.method):
    one metrics row per step, with the MAR trainer's column names where they apply (val_reward NaN between
    validations, and throughout without `val_prompts`). The text encoder stays frozen (as in the MAR trainer); the
    reference is a frozen copy of the policy as it was on entry (the base policy: a resumed run makes it first)."""

    def __init__(
        self,
        policy: ToyMaskPolicy,
        reward_fn: RewardFn,
        prompts: PromptSet,
        config: MaskGRPOConfig,
        val_prompts: PromptSet | None = None,
        sampling: MaskSamplingConfig | None = None,
    ):
        self.ref, optimizer, self.params = prepare(policy, config)
        super().__init__(policy, optimizer, config, f"{config.method}[{config.seed}]")
        self.reward_fn, self.prompts, self.val_prompts = reward_fn, prompts, val_prompts
        self.sampling = sampling or MaskSamplingConfig()

    def train_step(self) -> dict:
        row = train_step(
            self.policy,
            self.ref,
            self.optimizer,
            self.params,
            self.reward_fn,
            self.prompts,
            self.cfg,
            self.sampling,
            self.step,
        )
        self.step += 1
        return row

    def validate(self) -> list[float]:
        if self.val_prompts is None:
            return []
        return validate_scores(self.policy, self.reward_fn, self.val_prompts, self.sampling, self.cfg.val_prompts)


def train_mask_grpo(
    policy: ToyMaskPolicy,
    reward_fn: RewardFn,
    prompts: PromptSet,
    config: MaskGRPOConfig,
    val_prompts: PromptSet | None = None,
    sampling: MaskSamplingConfig | None = None,
) -> list[dict]:
    """Train `policy` in place in memory (no checkpoints); one metrics row per step (`MaskGRPOTrainer`)."""
    return MaskGRPOTrainer(policy, reward_fn, prompts, config, val_prompts, sampling).train()
