"""The GRPO algebra of MAR-GRPO as pure tensor functions (design.md §3.4, §3.5, §3.7, §3.9, §3.10).

Nothing here knows about models, rollouts or rewards: every function takes tensors and returns
tensors, so each equation can be tested against an independent computation. The trainer
combines them per chosen (AR step, diffusion step):

    obj   = per_token_policy_objective(lp, old_lp, A, clip_eps)    # [S, B, L]   clipped surrogate
    obj   = mte_loss(obj, uncertainty_mask(finals_m, k, predicted_m))  # [B, L]  Eq. 10 at step m
    w     = completion_mask & consistency_mask(...)                # [B, L]      Eq. 11
    loss  = -masked_mean(obj, w, W) + beta * masked_mean(kl_paper(mu, mu_ref), completion_mask, C)

W and C are the whole batch's weighted token counts, so the loss does not depend on how the batch
is split into micro-batches. The log-prob and the KL are both per-token sums over channels: one
scale, as in the official code where both are element means.

With S = 1 (MTE off), top_frac = 0 or tau = -inf each factor reduces to the plain GRPO loss
exactly (bitwise), which the tests check.

Shapes: B images, L tokens per image, D channels per token, S MTE trajectories (index 0 is the
committed one). Numerics run in float32 (or float64 if given float64), whatever the input dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "group_advantages",
    "per_token_policy_objective",
    "masked_mean",
    "policy_ratio_stats",
    "kl_paper",
    "kl_gaussian",
    "token_uncertainty",
    "uncertainty_mask",
    "consistency_mask",
    "mte_loss",
]


def _f32(x: torch.Tensor) -> torch.Tensor:
    """Upcast half / bfloat16 to float32; leave float32 / float64 as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


# --------------------------------------------------------------------------------------------
# 4. Advantages
# --------------------------------------------------------------------------------------------


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> tuple[torch.Tensor, float]:
    """GRPO group-normalised advantages (design.md §3.4): A_i = (R_i - mean_g) / (std_g + eps).

    Args:
        rewards: [N] with N = B * group_size; the G = group_size consecutive rewards of one
            group share a prompt (contiguous grouping, as rollouts are laid out).
        group_size: G.
        eps: added to the group std (1e-4 as in the paper's code).

    Returns:
        advantages: [N], float32 (float64 if the rewards are float64).
        frac_zero_std: fraction of groups whose rewards all tie; those get exactly 0 advantage
            (they carry no learning signal and would otherwise amplify float noise by 1/eps).

    The std is torch's unbiased std (ddof = 1), as the official code (`rewards.view(-1, G).std(dim=1)`).
    Statistics are computed in float64 so that ties and tiny spreads are handled exactly.
    """
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}; flatten the groups first")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    n = rewards.numel()
    if n == 0 or n % group_size != 0:
        raise ValueError(
            f"{n} rewards cannot be split into groups of {group_size}; "
            "pass B * group_size rewards, the G rewards of one prompt contiguous"
        )
    finite = torch.isfinite(rewards)
    if not bool(finite.all()):
        bad = (~finite).nonzero().flatten().tolist()
        groups = sorted({i // group_size for i in bad})
        raise ValueError(f"{len(bad)} non-finite reward(s) at indices {bad} (groups {groups})")

    out_dtype = torch.promote_types(rewards.dtype, torch.float32)
    r = rewards.to(torch.float64).view(-1, group_size)  # [B, G]
    mean = r.mean(dim=1, keepdim=True)  # [B, 1]
    tied = (r == r[:, :1]).all(dim=1, keepdim=True)  # [B, 1] all rewards equal (always, for G = 1)
    std = r.std(dim=1, correction=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)  # [B, 1] unbiased
    adv = ((r - mean) / (std + eps)).masked_fill(tied, 0.0)  # [B, G]
    return adv.reshape(-1).to(out_dtype), tied.double().mean().item()


# --------------------------------------------------------------------------------------------
# 5. Policy loss
# --------------------------------------------------------------------------------------------


def per_token_policy_objective(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float | None,
) -> torch.Tensor:
    """Unreduced clipped surrogate per token (design.md §3.5), to be maximised.

    l = min(r A, clip(r, 1 - eps, 1 + eps) A) with r = exp(log_prob - old_log_prob).
    With ``clip_eps=None`` it is the official code's REINFORCE form l = exp(lp - sg(lp)) A,
    whose value is A and whose gradient is A * grad lp (the stored old log-prob is unused).

    Args:
        log_prob: [..., B, L] per-token log-probability under the current policy (with grad).
        old_log_prob: [..., B, L] the rollout's log-probability (no grad needed).
        advantages: [B], broadcast over the tokens and any leading dims (e.g. S trajectories).
        clip_eps: PPO clip range, or None for the unclipped REINFORCE form.

    Returns:
        [..., B, L] objective per token.
    """
    if log_prob.shape != old_log_prob.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)} and old_log_prob {tuple(old_log_prob.shape)} differ in shape"
        )
    if log_prob.ndim < 2 or advantages.shape != log_prob.shape[-2:-1]:
        raise ValueError(
            f"advantages must be [B] for log_prob [..., B, L] = {tuple(log_prob.shape)}, got {tuple(advantages.shape)}"
        )
    lp = _f32(log_prob)  # [..., B, L]
    adv = advantages.detach().to(lp.dtype)[:, None]  # [B, 1]
    if clip_eps is None:
        return torch.exp(lp - lp.detach()) * adv  # value A, gradient A * d lp
    if clip_eps < 0:
        raise ValueError(f"clip_eps must be >= 0 or None (no clipping), got {clip_eps}")
    ratio = torch.exp(lp - _f32(old_log_prob).detach())  # [..., B, L]
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    return torch.minimum(ratio * adv, clipped * adv)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, count: torch.Tensor | float | None = None) -> torch.Tensor:
    """sum(values * mask) / count, count = sum(mask) by default: the token mean of the GRPO loss.

    Args:
        values: [..., B, L].
        mask: [B, L] (or any shape broadcastable to ``values``), bool or float weights; it is
            expanded over the leading dims, so S trajectories count S times in the denominator.
        count: the denominator, when ``mask`` is one micro-batch's share of a larger batch: the
            whole batch's weighted token count makes the micro-batch terms sum to the batch mean.

    A zero count gives exactly 0, still connected to ``values`` (zero gradient, no NaN).
    Masked-out entries are dropped with ``where``, so a non-finite value there cannot leak in.
    """
    w = mask.to(values.dtype).expand_as(values)  # [..., B, L]
    num = torch.where(w != 0, values * w, torch.zeros((), dtype=values.dtype, device=values.device)).sum()
    den = w.sum() if count is None else torch.as_tensor(count, dtype=values.dtype, device=values.device)
    return num / torch.where(den > 0, den, torch.ones_like(den))


@torch.no_grad()
def policy_ratio_stats(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float | None,
) -> dict[str, float]:
    """Logging stats of r = exp(lp - old) over the tokens with mask != 0 (unweighted).

    clip_frac counts tokens whose gradient the clip removes: r > 1 + eps with A > 0, or
    r < 1 - eps with A < 0 (always 0 with ``clip_eps=None``). With no selected token the
    ratio stats are NaN and clip_frac is 0.
    """
    ratio = torch.exp(_f32(log_prob) - _f32(old_log_prob))  # [..., B, L]
    sel = (mask != 0).expand_as(ratio)
    r = ratio[sel]  # [n]
    if r.numel() == 0:
        nan = float("nan")
        return {"clip_frac": 0.0, "ratio_min": nan, "ratio_max": nan, "ratio_mean": nan}
    if clip_eps is None:
        clip_frac = torch.zeros((), dtype=r.dtype, device=r.device)
    else:
        a = advantages.to(r.dtype)[:, None].expand_as(ratio)[sel]  # [n]
        clipped = ((r > 1.0 + clip_eps) & (a > 0)) | ((r < 1.0 - clip_eps) & (a < 0))
        clip_frac = clipped.to(r.dtype).mean()
    values = torch.stack([clip_frac, r.min(), r.max(), r.mean()]).tolist()  # one device sync
    return dict(zip(("clip_frac", "ratio_min", "ratio_max", "ratio_mean"), values))


# --------------------------------------------------------------------------------------------
# 7. KL to the reference policy
# --------------------------------------------------------------------------------------------


def kl_paper(mean: torch.Tensor, ref_mean: torch.Tensor) -> torch.Tensor:
    """The paper's KL term, Eq. 14: per token, the sum over channels of exp(d) - d - 1, d = mu_ref - mu_theta.

    Summed over channels like the per-token log-prob, so that beta weighs the two terms as in the
    official code (where both are element means); a channel mean would make the KL D times lighter.

    Args:
        mean: [B, L, D] the policy's predicted mean mu_theta (with grad).
        ref_mean: [B, L, D] the frozen reference policy's mean for the same x_t.

    Returns:
        [B, L] per-token values (sum over D), for the trainer to average over the completion
        mask. Computed as expm1(d) - d: equal to exp(d) - d - 1, but accurate to ~1e-3 relative
        for |d| ~ 1e-4 in float32, where exp(d) - d - 1 is pure rounding noise.
    """
    if mean.shape != ref_mean.shape:
        raise ValueError(f"mean {tuple(mean.shape)} and ref_mean {tuple(ref_mean.shape)} differ in shape")
    d = _f32(ref_mean) - _f32(mean)  # [B, L, D]
    return (torch.expm1(d) - d).sum(dim=-1)  # [B, L]


def kl_gaussian(
    mean: torch.Tensor,
    ref_mean: torch.Tensor,
    std: torch.Tensor | float,
    ref_std: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Exact KL(N(mean, std^2 I) || N(ref_mean, ref_std^2 I)) per token, summed over channels.

    log(ref_std / std) + (std^2 + (mean - ref_mean)^2) / (2 ref_std^2) - 1/2 per channel. With a
    learned variance the log-sigma terms matter: without them the KL would fall as the policy's sigma
    grows, rewarding a policy that inflates its noise. ``ref_std=None`` means the two share sigma.

    Args:
        mean, ref_mean: [B, L, D].
        std, ref_std: sigma_t of the policy and the reference: a Python float, a 0-d tensor or a
            tensor with the same number of dims as ``mean`` (e.g. [B, L, 1] or [B, L, D]); a
            [B, L] std is refused because it would silently broadcast against D when L == D.
            Must be > 0 (no KL at a deterministic step).

    Returns:
        [B, L], summed over D (a true KL in nats of each token's D-dim Gaussian), the same scale
        as ``kl_paper`` and the per-token log-prob.
    """
    if mean.shape != ref_mean.shape:
        raise ValueError(f"mean {tuple(mean.shape)} and ref_mean {tuple(ref_mean.shape)} differ in shape")
    diff = _f32(mean) - _f32(ref_mean)  # [B, L, D]

    def as_std(x):
        t = torch.as_tensor(x, device=diff.device)
        if t.ndim not in (0, diff.ndim):
            raise ValueError(
                f"std must be a scalar or have {diff.ndim} dims (e.g. [B, L, 1]), got shape {tuple(t.shape)}"
            )
        return _f32(t).to(diff.dtype)

    s = as_std(std)
    s_ref = s if ref_std is None else as_std(ref_std)
    per_channel = torch.log(s_ref / s) + (s.pow(2) + diff.pow(2)) / (2.0 * s_ref.pow(2)) - 0.5
    return per_channel.expand_as(diff).sum(dim=-1)  # [B, L]


# --------------------------------------------------------------------------------------------
# 9. +MTE: uncertainty mask and multi-trajectory combination
# --------------------------------------------------------------------------------------------


def token_uncertainty(final_latents: torch.Tensor) -> torch.Tensor:
    """u_j of MTE (design.md §3.9): std over the S final latents [S, ..., D] (ddof = 0, so S = 1 gives 0),
    averaged over the D channels: [...]."""
    return _f32(final_latents).std(dim=0, correction=0).mean(dim=-1)


def uncertainty_mask(
    final_latents: torch.Tensor,
    top_frac: float,
    candidates: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mask M of the most uncertain tokens, the M of paper Eq. 10 (MTE).

    u_j = std over the S final clean latents of token j (population std, ddof = 0, so S = 1
    gives u = 0 rather than NaN; the ddof only rescales u and never changes the ranking),
    averaged over the D channels. The top k tokens of each image by u form M.

    Args:
        final_latents: [S, B, L, D], the S trajectories' final latents (index 0 committed).
        top_frac: fraction in [0, 1]; k = floor(top_frac * n + 0.5) tokens per image (nearest,
            halves up), so 0 selects no token and 1 selects all. The official code floors
            (max(1, int(top_frac * n))): at 1024 tokens the two agree to 0.1%, but over the toy's
            16 tokens flooring covers 22% of the loss tokens instead of 30%.
        candidates: optional [B, L] bool restricting the choice: the tokens predicted at the AR
            step (Algorithm 2's M^m); n is then the number of candidates of that image and only
            candidates can be selected. None: every token.

    Returns:
        [B, L] bool. Ties in u are broken by token index (lower index first), deterministically.
    """
    if final_latents.ndim != 4:
        raise ValueError(f"final_latents must be [S, B, L, D], got shape {tuple(final_latents.shape)}")
    if not 0.0 <= top_frac <= 1.0:
        raise ValueError(f"top_frac must be in [0, 1], got {top_frac}")
    _, B, L, _ = final_latents.shape
    device = final_latents.device
    u = token_uncertainty(final_latents)  # [B, L]
    if candidates is None:
        candidates = torch.ones(B, L, dtype=torch.bool, device=device)
    elif candidates.shape != (B, L) or candidates.dtype != torch.bool:
        raise ValueError(
            f"candidates must be bool [B, L] = [{B}, {L}], got {candidates.dtype} {tuple(candidates.shape)}"
        )
    n = candidates.sum(dim=-1).double()  # [B]
    k = torch.floor(n * top_frac + 0.5).long()  # [B] tokens to keep per image
    score = u.masked_fill(~candidates, -math.inf)  # [B, L] non-candidates rank last
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices  # [B, L]
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(L, device=device).expand(B, L))
    return (rank < k[:, None]) & candidates


def mte_loss(per_traj_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Multi-trajectory combination, paper Eq. 10: M * mean_s l^(s) + (1 - M) * l^(1).

    Args:
        per_traj_loss: [S, ..., B, L] per-token objective (or loss; the map is linear) of each
            trajectory; index 0 is the committed trajectory l^(1).
        mask: [B, L] bool, the uncertainty mask M.

    Returns:
        [..., B, L]. With S = 1 or an all-False mask it is exactly (bitwise) l^(1).
    """
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool, got {mask.dtype}")
    committed = per_traj_loss[0]  # [..., B, L]
    if per_traj_loss.shape[0] == 1:
        return committed
    return torch.where(mask, per_traj_loss.mean(dim=0), committed)


# --------------------------------------------------------------------------------------------
# 10. +Sim: consistency mask
# --------------------------------------------------------------------------------------------


def consistency_mask(
    x0_prev: torch.Tensor,
    x0_cur: torch.Tensor,
    x_final: torch.Tensor,
    committed: torch.Tensor,
    tau: float = 0.0,
) -> torch.Tensor:
    """Consistency weights kappa of AR step m, paper Eq. 11.

    sim_j(m) = cos(x0_m[j], x_final[j]) over channels; kappa_j(m) = 1[sim_j(m) - sim_j(m-1) > tau]
    OR token j is committed at step m (a token's own step always trains).

    Args:
        x0_prev: [B, L, D] clean prediction x0 at step m - 1 (the caller chooses what stands in
            for the first step).
        x0_cur: [B, L, D] clean prediction at step m.
        x_final: [B, L, D] final latent of the trajectory.
        committed: [B, L] bool, tokens committed (predicted) at step m.
        tau: threshold (0 by default); -inf keeps every token.

    Returns:
        [B, L] bool. Cosine uses torch's eps = 1e-8 on the norms (a zero vector has sim 0).
    """
    if committed.dtype != torch.bool:
        raise ValueError(f"committed must be bool, got {committed.dtype}")
    final = _f32(x_final)
    sim_prev = F.cosine_similarity(_f32(x0_prev), final, dim=-1)  # [B, L]
    sim_cur = F.cosine_similarity(_f32(x0_cur), final, dim=-1)  # [B, L]
    return ((sim_cur - sim_prev) > tau) | committed
