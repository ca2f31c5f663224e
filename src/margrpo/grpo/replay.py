"""Replay of a recorded rollout: the log-probs of the chosen AR and diffusion steps recomputed under the current
parameters (design.md §3.3), in batched passes over the rows training reads; with unchanged parameters the PPO ratio
is exactly 1 (`policy.invariant`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from margrpo.diffusion import Sampler
from margrpo.grpo.rollout import Rollout, ar_pass, guided_output, make_sampler
from margrpo.policy.base import MARPolicy, deterministic


@dataclass
class Replay:
    """Recomputed quantities at chosen (AR step, diffusion step) pairs: M AR steps x U diffusion steps."""

    log_prob: Tensor  # [M, U, N, L] (0 where the token was known)
    mean: Tensor  # [M, U, N, L, D]
    std: Tensor  # [M, U, N, L, 1 or D]
    mask: Tensor  # [M, U, N, L] bool: unknown token at a stochastic step (the completion mask)
    mte_log_prob: Tensor | None = (
        None  # [M, S-1, U, N, L] (0 where not replayed: no MTE at that step, or outside mte_tokens)
    )


@dataclass
class _Rows:
    """Recorded transitions x_t -> x_prev to score: diffusion step `t` of chosen AR step `m`, token (`n`, `l`);
    `index` places each row's result in its dense output."""

    x_t: Tensor
    x_prev: Tensor
    t: Tensor
    m: Tensor
    n: Tensor
    l: Tensor  # noqa: E741
    index: tuple[Tensor, ...]


def replay(
    policy: MARPolicy,
    rollout: Rollout,
    ar_steps: Tensor,
    diff_steps: Tensor,
    *,
    logprob_cfg: str = "exact",
    with_mte: bool = False,
    mte_tokens: Tensor | None = None,
    chunk_rows: int = 1 << 16,
) -> Replay:
    """Recompute log-probs of the recorded transitions at the chosen steps, batched (design.md §3.3).

    ar_steps: LongTensor [M]; diff_steps: LongTensor [M, U] (stochastic steps only). Gradients flow
    to whatever parameters require them. `logprob_cfg="cond_only"` scores with the conditional branch
    alone (the official shortcut; the ratio is then not 1 at unchanged parameters).
    `mte_tokens` [K, N, L] bool limits the extra MTE trajectories of AR step k to those tokens (the
    uncertainty mask M^k: Eq. 10 uses no other); their other entries of `mte_log_prob` are left 0.
    """
    if logprob_cfg not in ("exact", "cond_only"):
        raise ValueError(f"Unknown logprob_cfg: {logprob_cfg!r}; expected 'exact' or 'cond_only'")
    ar_steps, diff_steps = (
        ar_steps.to(rollout.latents.device),
        diff_steps.to(rollout.latents.device),
    )  # they index its tensors
    rollout.require_full(ar_steps, "replay")
    with deterministic(policy):
        sampler = make_sampler(policy, rollout.sampling)
        M, U = diff_steps.shape
        N, L, D = rollout.latents.shape
        unknown = ~rollout.known[ar_steps]  # [M, N, L]
        guided = rollout.sampling.cfg_scale != 1.0 and logprob_cfg == "exact"
        z_c, z_u = _chosen_step_conditions(policy, rollout, ar_steps, guided)
        groups = [_committed_rows(rollout, ar_steps, diff_steps, unknown)]
        S1 = rollout.trajectories - 1
        if with_mte and S1:
            groups.append(_mte_rows(rollout, ar_steps, diff_steps, unknown, mte_tokens))
        lp, mean, std = _score_rows(policy, sampler, rollout, ar_steps, z_c, z_u, groups, chunk_rows)
        device = rollout.latents.device
        committed = groups[0].index
        return Replay(
            log_prob=torch.zeros(M, U, N, L, device=device).index_put(committed, lp[0]),
            mean=torch.zeros(M, U, N, L, D, device=device).index_put(committed, mean[0]),
            std=torch.ones(M, U, N, L, D, device=device).index_put(committed, std[0]),
            mask=completion_mask(rollout, ar_steps, diff_steps, sampler),
            mte_log_prob=torch.zeros(M, S1, U, N, L, device=device).index_put(groups[1].index, lp[1])
            if len(groups) > 1
            else None,
        )


def completion_mask(rollout: Rollout, ar_steps: Tensor, diff_steps: Tensor, sampler: Sampler) -> Tensor:
    """[M, U, N, L] bool: the tokens still unknown at each chosen AR step, at its stochastic chosen diffusion steps
    (a replay's `mask`; the trainer's whole-batch token counts take it without a replay)."""
    M, U = diff_steps.shape
    stochastic = sampler.is_stochastic(diff_steps.reshape(-1)).view(M, U).to(rollout.known.device)
    return (~rollout.known[ar_steps])[:, None] & stochastic[:, :, None, None]


def _chosen_step_conditions(policy: MARPolicy, rollout: Rollout, ar_steps: Tensor, guided: bool):
    """z of every chosen AR step, conditional and (if guided) unconditional, in one transformer pass: [M, N, L, W]."""
    N, L, D = rollout.latents.shape
    M = len(ar_steps)
    cond = policy.prepare_condition(policy.encode_prompts(rollout.prompts))  # with gradients: once per image
    uncond = policy.prepare_condition(policy.null_condition(N)) if guided else None
    known = rollout.known[ar_steps]  # [M, N, L]
    tokens = torch.where(known[..., None], rollout.latents[None], torch.zeros_like(rollout.latents[None]))
    z_c, z_u = ar_pass(
        policy,
        tokens.reshape(M * N, L, D),
        known.reshape(M * N, L),
        cond.tile(M),
        None if uncond is None else uncond.tile(M),
    )
    return z_c.view(M, N, L, -1), None if z_u is None else z_u.view(M, N, L, -1)


def _committed_rows(rollout: Rollout, ar_steps: Tensor, diff_steps: Tensor, unknown: Tensor) -> _Rows:
    """Every unknown token of every chosen AR step at every chosen diffusion step (the completion mask)."""
    M, U = diff_steps.shape
    m, u, n, l = unknown[:, None].expand(M, U, *unknown.shape[1:]).nonzero(as_tuple=True)  # noqa: E741
    k, t = ar_steps[m], diff_steps[m, u]
    return _Rows(rollout.states[k, t, n, l], rollout.states[k, t + 1, n, l], t, m, n, l, index=(m, u, n, l))


def _mte_rows(
    rollout: Rollout, ar_steps: Tensor, diff_steps: Tensor, unknown: Tensor, mte_tokens: Tensor | None
) -> _Rows:
    """The extra trajectories' transitions at the chosen AR steps that have them (within `mte_tokens`)."""
    M, U = diff_steps.shape
    S1 = rollout.trajectories - 1
    slots = rollout.mte_slots()[ar_steps.to(unknown.device)]  # [M], -1: no extra trajectories at that step
    extra = unknown & (slots >= 0)[:, None, None]  # [M, N, L]
    if mte_tokens is not None:
        extra = extra & mte_tokens.to(unknown.device)[ar_steps]
    m, s, u, n, l = extra[:, None, None].expand(M, S1, U, *unknown.shape[1:]).nonzero(as_tuple=True)  # noqa: E741
    t, slot = diff_steps[m, u], slots[m]
    return _Rows(
        rollout.mte_states[slot, s, t, n, l],
        rollout.mte_states[slot, s, t + 1, n, l],
        t,
        m,
        n,
        l,
        index=(m, s, u, n, l),
    )


def _score_rows(
    policy: MARPolicy,
    sampler: Sampler,
    rollout: Rollout,
    ar_steps: Tensor,
    z_c: Tensor,
    z_u: Tensor | None,
    groups: list[_Rows],
    chunk_rows: int,
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Every row of every group through the head in as few passes as memory allows: (log-prob, mean, std) per group."""
    device = rollout.latents.device
    sizes = [len(g.t) for g in groups]
    x_t, x_prev, t, m, n, l = (  # noqa: E741  (the fields' own names)
        torch.cat([getattr(g, f) for g in groups]) for f in ("x_t", "x_prev", "t", "m", "n", "l")
    )
    lp, mean, std = [], [], []
    for a in range(0, len(t), chunk_rows):
        b = slice(a, a + chunk_rows)
        scale = rollout.cfg[ar_steps[m[b]].cpu()].to(device)
        zu = None if z_u is None else z_u[m[b], n[b], l[b]]
        out = guided_output(policy, x_t[b], sampler.model_time(t[b]).to(device), z_c[m[b], n[b], l[b]], zu, scale)
        step = sampler.step(out.float(), t[b], x_t[b], prev_sample=x_prev[b], temperature=rollout.sampling.temperature)
        (
            lp.append(step.log_prob),
            mean.append(step.mean),
            std.append(step.std.expand(-1, step.mean.shape[-1]) if step.std.dim() == 2 else step.std),
        )
    if not lp:  # no rows at all
        D = x_t.shape[-1]
        lp, mean, std = [x_t.new_zeros(0)], [x_t.new_zeros(0, D)], [x_t.new_zeros(0, D)]
    return tuple(list(torch.cat(v).float().split(sizes)) for v in (lp, mean, std))


def recorded(rollout: Rollout, ar_steps: Tensor, diff_steps: Tensor) -> tuple[Tensor, Tensor | None]:
    """The rollout's own log-probs at the chosen steps: [M, U, N, L] and MTE [M, S-1, U, N, L]
    (0 at steps without extra trajectories)."""
    rollout.require_full(ar_steps, "the recorded log-probs")
    lp = rollout.log_probs[ar_steps[:, None], diff_steps]  # [M, U, N, L]
    mte = None
    if rollout.mte_log_probs is not None:
        slots = rollout.mte_slots()[ar_steps.to(rollout.known.device)]  # [M]
        per_step = rollout.mte_log_probs[slots.clamp(min=0)]  # [M, S-1, T, N, L]
        mte = per_step[
            torch.arange(len(slots), device=per_step.device)[:, None], :, diff_steps.to(per_step.device)
        ].permute(0, 2, 1, 3, 4)  # [M, S-1, U, N, L]
        mte = mte * (slots >= 0).to(mte.dtype)[:, None, None, None, None]
    return lp, mte
