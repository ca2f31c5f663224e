"""The method in one place: what each variant changes in the loss, and one micro-batch's loss (design.md §3.5-3.10).

The equations are pure tensor functions in `grpo.objective`; this module applies them to a rollout record. Every
variant is a switch of `GRPOConfig` (grpo/config.py) that acts in exactly one of these places:

| variant   | config keys                    | where it acts                                                  |
|-----------|--------------------------------|----------------------------------------------------------------|
| GRPO      | clip_eps, beta, kl, reinforce  | `micro_batch_loss`: clipped surrogate + beta * KL (Eq. 7, 14)  |
| +Fix      | freeze_head                    | grpo/build.py: the head is not trained (design.md §3.8)        |
| +MTE      | trajectories (S), top_frac (k) | `variant_masks` -> M^k; `micro_batch_loss`: Eq. 10             |
| +Sim      | sim, tau                       | `variant_masks` -> kappa; `loss_weights`: Eq. 11               |
| committed | loss_tokens                    | `loss_weights`: only the tokens each step commits              |
| old log-p | old_logprob                    | `log_prob_old`: the record's, or this pass's own (detached)    |

The trainer (grpo/trainer.py) rolls out, replays the chosen steps under the policy and the reference, and calls
`micro_batch_loss` on what the replays return; nothing here runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from margrpo.grpo.config import GRPOConfig
from margrpo.grpo.objective import (
    consistency_mask,
    kl_gaussian,
    kl_paper,
    masked_mean,
    mte_loss,
    per_token_policy_objective,
    policy_ratio_stats,
    uncertainty_mask,
)
from margrpo.grpo.replay import Replay, recorded
from margrpo.grpo.rollout import Rollout


@dataclass(frozen=True)
class OldLogProbs:
    """log_prob_old of a micro-batch at its chosen steps: the committed trajectory's [M, U, n, L] and MTE's extra
    trajectories' [M, S-1, U, n, L] (None without MTE)."""

    committed: torch.Tensor
    mte: torch.Tensor | None = None

    def steps(self, part: slice) -> OldLogProbs:
        """These log-probs at some of the chosen AR steps (a chunk of the replay)."""
        return OldLogProbs(self.committed[part], None if self.mte is None else self.mte[part])


@dataclass(frozen=True)
class TokenCounts:
    """The whole batch's loss-token counts at each chosen AR step [M], the denominators that make the micro-batch
    losses sum to the batch's token mean: the policy term's (Sim-weighted) and the KL's."""

    policy: torch.Tensor
    kl: torch.Tensor

    def steps(self, part: slice) -> TokenCounts:
        return TokenCounts(self.policy[part], self.kl[part])


@dataclass(frozen=True)
class LossInputs:
    """What one micro-batch's loss reads, by name: its images' sub-rollout and advantages, the chosen AR steps [m]
    and diffusion steps [m, U], MTE's M^k and Sim's keep-weights [K, n, L] (None: off), log_prob_old at these steps
    (None: read off this pass), and the whole batch's token counts (None: this rollout is the whole batch)."""

    rollout: Rollout
    adv: torch.Tensor  # [n]
    ar_steps: torch.Tensor
    diffusion_steps: torch.Tensor
    mte_mask: torch.Tensor | None = None
    sim_keep: torch.Tensor | None = None
    old: OldLogProbs | None = None
    counts: TokenCounts | None = None


def variant_masks(
    rollout: Rollout, trajectories: int, top_frac: float, tau: float | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """MTE uncertainty masks M^m per AR step [K, N, L] (Eq. 10; empty at steps without extra trajectories; None
    when trajectories == 1) and Sim keep-weights per AR step [K, N, L] (Eq. 11; None when tau is None: no Sim)."""
    mte = None
    if trajectories > 1:
        finals = rollout.mte_finals()  # [M', S, N, L, D], index 0 the rollout's own sample at step m
        Mp, S, N, L, D = finals.shape
        per_step = uncertainty_mask(
            finals.transpose(0, 1).reshape(S, Mp * N, L, D), top_frac, rollout.mte_candidates().reshape(Mp * N, L)
        )  # top k% of each image's predicted tokens
        mte = torch.zeros_like(rollout.known)
        mte[rollout.mte_steps] = per_step.view(Mp, N, L)
    sim = None
    if tau is not None:
        x0, final, full = rollout.step_clean(), rollout.latents.float(), rollout.full_steps()  # x0: [K, N, L, D]
        keep = [
            torch.ones_like(rollout.committed[k])
            if k == 0 or not full[k - 1 : k + 1].all()  # untrained steps
            else consistency_mask(x0[k - 1], x0[k], final, rollout.committed[k], tau)
            for k in range(len(x0))
        ]
        sim = torch.stack(keep)
    return mte, sim


def loss_weights(
    completion: torch.Tensor, rollout: Rollout, ar_steps: torch.Tensor, sim_keep: torch.Tensor | None, loss_tokens: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which tokens each chosen (AR step, diffusion step) trains, [M, U, N, L] float: the KL's token mask (the
    completion mask, or its committed tokens) and the policy loss's weights (that mask times Sim's kappa)."""
    tokens = completion
    if loss_tokens == "committed":
        tokens = tokens & rollout.committed[ar_steps][:, None]
    tokens = tokens.float()
    weight = tokens if sim_keep is None else tokens * sim_keep[ar_steps][:, None].float()
    return tokens, weight


def log_prob_old(
    replayed: Replay, old: OldLogProbs | None, rollout: Rollout, ar_steps, diffusion_steps, mte_mask, source: str
) -> OldLogProbs:
    """log_prob_old of a micro-batch's replay `replayed`: `old` when given, else the record's (`source` "recorded")
    or this pass's own, detached ("recomputed"); MTE's entries that were not replayed take the replay's own (ratio
    1, no gradient, never NaN)."""
    if old is None:
        if source == "recorded":
            old = OldLogProbs(*recorded(rollout, ar_steps, diffusion_steps))
        else:
            mte = None if replayed.mte_log_prob is None else replayed.mte_log_prob.detach()
            old = OldLogProbs(replayed.log_prob.detach(), mte)
    if mte_mask is not None and old.mte is not None:
        mte = torch.where(mte_mask[ar_steps][:, None, None], old.mte, replayed.mte_log_prob.detach())
        old = OldLogProbs(old.committed, mte)
    return old


def micro_batch_loss(
    x: LossInputs, replayed: Replay, ref: Replay | None, cfg: GRPOConfig
) -> tuple[torch.Tensor, dict]:
    """The loss of one micro-batch and its ratio stats, from the policy's replay of its chosen steps (`replayed`,
    with gradients) and the frozen reference's (`ref`, None: beta = 0): the mean over the chosen AR steps of each
    step's share of the batch's token-mean loss (Eq. 7), the clipped surrogate combined over MTE's trajectories
    (Eq. 10) and weighted by Sim's kappa (Eq. 11), plus beta times the KL (Eq. 14); under `reinforce`, the sum over
    the chosen steps (the official update). With `x.counts` the whole batch's token counts, the micro-batch losses
    sum to the batch loss whatever the split."""
    tokens, weight = loss_weights(replayed.mask, x.rollout, x.ar_steps, x.sim_keep, cfg.loss_tokens)  # [M, U, n, L]
    counts = x.counts if x.counts is not None else TokenCounts(weight.sum((1, 2, 3)), tokens.sum((1, 2, 3)))
    old = log_prob_old(replayed, x.old, x.rollout, x.ar_steps, x.diffusion_steps, x.mte_mask, cfg.old_logprob)
    objective = per_token_policy_objective(replayed.log_prob, old.committed, x.adv, cfg.clip_eps)  # [M, U, n, L]
    kl = None
    if ref is not None:
        mean, std = replayed.mean, replayed.std
        kl = kl_paper(mean, ref.mean) if cfg.kl == "paper" else kl_gaussian(mean, ref.mean, std, ref.std)
    losses, kls = [], []
    for m, k in enumerate(x.ar_steps.tolist()):
        step_objective = objective[m]  # [U, n, L]
        if x.mte_mask is not None:  # Eq. 10 on every loss token of step k
            extra = per_token_policy_objective(replayed.mte_log_prob[m], old.mte[m], x.adv, cfg.clip_eps)
            step_objective = mte_loss(torch.cat([step_objective[None], extra]), x.mte_mask[k])
        losses.append(-masked_mean(step_objective, weight[m], counts.policy[m]))
        if kl is not None:
            kls.append(masked_mean(kl[m], tokens[m], counts.kl[m]))
    # Eq. 7 averages over the chosen AR steps; the official REINFORCE update calls backward once per
    # chosen step, so its gradients are the sum over the |M| steps
    reduce = torch.sum if cfg.reinforce else torch.mean
    policy_term = reduce(torch.stack(losses))
    kl_term = reduce(torch.stack(kls)) if kls else torch.zeros((), device=policy_term.device)
    stats = policy_ratio_stats(replayed.log_prob, old.committed, x.adv, tokens, cfg.clip_eps)
    stats.update(policy_loss=policy_term.item(), kl=kl_term.item())
    return policy_term + cfg.beta * kl_term, stats
