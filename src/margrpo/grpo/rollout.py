"""Batched MAR generation with classifier-free guidance that records what GRPO trains on.

At AR step k the AR model gives z_k for every position; the head then runs the full stochastic
diffusion trajectory for every still-unknown token (the completion mask, as in the paper's code),
and the tokens scheduled for step k are committed. The record (design.md §3.2) holds the order, the
known / committed masks per AR step, every (x_t, x_{t-1}, log_prob) of every diffusion step, the
final latent and, for MTE (Algorithm 2), S - 1 extra trajectories of every token predicted at the
AR steps chosen for training, drawn from the same z_k inside the loop.
Only the steps that training reads need every unknown token's trajectory (`full_steps`: the chosen steps, and
their predecessors for Sim); at the others the head denoises the committed tokens alone, from the same noise
draws, so the images do not change and the rollout's head does a fraction of the work.
`grpo.replay` recomputes log-probs from the record; with unchanged parameters the ratio is exactly 1.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from margrpo.diffusion import Sampler
from margrpo.policy.base import MARPolicy, TextCondition, deterministic


@dataclass
class SamplingConfig:
    ar_steps: int = 16  # K
    diffusion_steps: int = 20  # T
    cfg_scale: float = 3.0
    cfg_schedule: str = "linear"  # "constant" or MAR's "linear" ramp over the committed fraction
    temperature: float = 1.0
    noise_level: float = 0.7  # flow SDE only
    final_step_noise: bool = False  # the head's last step is stochastic too (stochastic_final of its sampler)

    def __post_init__(self):
        if self.cfg_schedule not in ("constant", "linear"):
            raise ValueError(f"Unknown cfg_schedule: {self.cfg_schedule!r}; expected 'constant' or 'linear'")
        if self.ar_steps < 1 or self.diffusion_steps < 2:
            raise ValueError("ar_steps must be >= 1 and diffusion_steps >= 2")


def make_sampler(policy: MARPolicy, sampling: SamplingConfig) -> Sampler:
    """The policy's head sampler for these settings (rollout and replay build the same one)."""
    sampler = policy.make_sampler(sampling.diffusion_steps, sampling.noise_level)
    if sampling.final_step_noise:
        if not hasattr(sampler, "config") or not hasattr(sampler.config, "stochastic_final"):
            raise ValueError(
                f"final_step_noise: {type(sampler).__name__} has no stochastic final step (stochastic_final)"
            )
        sampler = type(sampler)(sampler.config, stochastic_final=True)
    return sampler


def stochastic_steps(sampling: SamplingConfig) -> int:
    """How many diffusion steps carry a log-prob (the training subset is drawn from these)."""
    return sampling.diffusion_steps if sampling.final_step_noise else sampling.diffusion_steps - 1


def unknown_after_steps(seq_len: int, ar_steps: int, rounding: str = "floor") -> list[int]:
    """The cosine mask schedule: tokens still unknown after each AR step (ends at 0).

    "floor" (MAR's mask_by_order): floor(L cos(pi/2 (k+1)/K)), clamped so that every step commits
    >= 1 token and leaves >= 1 for each later one: exactly K steps. "round" (NOVA's pipeline): the
    lengths round(L cos(pi/2 k/K)); a step that would commit nothing is dropped, as NOVA drops it, so
    there may be fewer than K steps (63 of 64 at L = 1024). The rollout's K is the length of this list.
    """
    if ar_steps > seq_len:
        raise ValueError(f"ar_steps ({ar_steps}) cannot exceed the number of tokens ({seq_len})")
    if rounding == "round":
        lengths = [round(seq_len * math.cos(math.pi / 2 * k / ar_steps)) for k in range(1, ar_steps + 1)]
        return [left for before, left in zip([seq_len] + lengths, lengths) if left < before]
    if rounding != "floor":
        raise ValueError(f"Unknown rounding: {rounding!r}; expected 'floor' or 'round'")
    counts, unknown = [], seq_len
    for k in range(ar_steps):
        if k == ar_steps - 1:
            left = 0
        else:
            left = math.floor(seq_len * math.cos(math.pi / 2 * (k + 1) / ar_steps))
            left = max(ar_steps - 1 - k, min(unknown - 1, left))  # leave >= 1 token for each later step
        counts.append(left)
        unknown = left
    return counts


def ar_schedule(policy: MARPolicy, sampling: SamplingConfig) -> list[int]:
    """The policy's mask schedule for these settings: tokens unknown after each of the rollout's K AR steps."""
    return unknown_after_steps(policy.seq_len, sampling.ar_steps, policy.mask_rounding)


def cfg_scales(sampling: SamplingConfig, seq_len: int, schedule: list[int]) -> list[float]:
    """CFG scale per AR step of `schedule` (unknown_after_steps): constant, or MAR's linear ramp in the committed
    fraction."""
    s = sampling.cfg_scale
    if sampling.cfg_schedule == "constant":
        return [s] * len(schedule)
    return [1 + (s - 1) * (seq_len - left) / seq_len for left in schedule]


@dataclass
class Rollout:
    """Everything generation decided. N images, K AR steps, T diffusion steps, L tokens of D channels."""

    prompts: list[str]  # [N] (prompt p repeated group_size times, consecutively)
    latents: Tensor  # [N, L, D] final tokens
    images: Tensor  # [N, 3, H, W] in [0, 1]
    orders: Tensor  # [N, L] generation order (a random permutation per image)
    known: Tensor  # [K, N, L] bool, known before step k
    committed: Tensor  # [K, N, L] bool, committed at step k
    states: Tensor  # [K, T + 1, N, L, D] float32, x_T .. x_0 of the committed trajectory (0 where known)
    log_probs: Tensor  # [K, T, N, L] float32 log p(x_{t-1} | x_t, z_k) (0 where known or deterministic)
    cfg: Tensor  # [K] guidance scale per AR step
    sampling: SamplingConfig
    # MTE (Algorithm 2): at each AR step of `mte_steps` (chosen before the rollout), S - 1 more
    # trajectories of every token predicted there (all unknown tokens), from the same z_k. Only those
    # steps hold them: |M| of K steps, not all (12 of 64 at the paper's schedule).
    mte_steps: Tensor | None = None  # [M'] sorted AR step indices
    mte_states: Tensor | None = None  # [M', S-1, T + 1, N, L, D] (0 where the token was known)
    mte_log_probs: Tensor | None = None  # [M', S-1, T, N, L]
    # [K] bool: the AR steps whose record holds every unknown token's trajectory; at the others only the
    # committed tokens' (states and log-probs 0 for the rest). None: every step.
    full: Tensor | None = None

    @property
    def trajectories(self) -> int:
        return 1 if self.mte_states is None else 1 + self.mte_states.shape[1]

    def full_steps(self) -> Tensor:
        """[K] bool (CPU): the AR steps whose record holds every unknown token (`full`, or all of them)."""
        return torch.ones(self.known.shape[0], dtype=torch.bool) if self.full is None else self.full.cpu()

    def require_full(self, ar_steps: Tensor, what: str) -> None:
        """Fail unless every AR step in `ar_steps` recorded every unknown token (see `full`)."""
        full = self.full_steps()
        if not bool(full[ar_steps.cpu()].all()):
            missing = sorted(set(ar_steps.tolist()) - set(full.nonzero().flatten().tolist()))
            raise ValueError(
                f"{what} needs every unknown token's trajectory at AR steps {missing}, but the rollout "
                f"recorded only the committed tokens there: generate with those steps in full_steps"
            )

    def step_clean(self) -> Tensor:
        """x0 per AR step [K, N, L, D]: the clean latent each unknown token reached at step k (known: final).
        Where the step is not in `full`, only its committed tokens' entries are real."""
        clean = self.states[:, -1]
        return torch.where(self.known[..., None], self.latents.float()[None], clean)

    def mte_slots(self) -> Tensor:
        """[K] long: the slot of AR step k in the MTE record, -1 where step k has no extra trajectories."""
        K = self.known.shape[0]
        slots = torch.full((K,), -1, dtype=torch.long, device=self.known.device)
        if self.mte_steps is not None:
            slots[self.mte_steps.to(slots.device)] = torch.arange(len(self.mte_steps), device=slots.device)
        return slots

    def mte_finals(self) -> Tensor:
        """Final clean latents of the S trajectories at each MTE step [M', S, N, L, D]: index 0 is the
        rollout's own sample at that step (x0 of every token predicted there), 1.. the extra ones."""
        if self.mte_steps is None:
            raise ValueError("this rollout has no MTE trajectories (generate with trajectories > 1)")
        own = self.states[self.mte_steps.to(self.states.device), -1]  # [M', N, L, D]
        return torch.cat([own[:, None], self.mte_states[:, :, -1]], dim=1)

    def mte_candidates(self) -> Tensor:
        """[M', N, L] bool: the tokens predicted (still unknown) at each MTE step, the candidates of M^m."""
        return ~self.known[self.mte_steps.to(self.known.device)]


def guided_output(
    policy: MARPolicy, x: Tensor, t: Tensor, z_c: Tensor, z_u: Tensor | None, scale: Tensor | float
) -> Tensor:
    """Head output with CFG on the prediction channels; a learned variance comes from the conditional branch."""
    if z_u is None:
        return policy.head(x, t, z_c)
    out_c, out_u = policy.head(torch.cat([x, x]), torch.cat([t, t]), torch.cat([z_c, z_u])).chunk(2)
    D = x.shape[-1]
    scale = scale if isinstance(scale, float) else scale[:, None]
    pred = out_u[:, :D] + scale * (out_c[:, :D] - out_u[:, :D])
    return torch.cat([pred, out_c[:, D:]], dim=-1)


def _denoise_groups(policy, sampler: Sampler, groups, scale, temperature):
    """Denoise several row groups (x [R, D], z_c, z_u, generator, keep) with one head call and one sampler
    step per diffusion step.

    Each group draws its noise from its own generator (`variance_noise`), so batching the groups, MTE's
    extra trajectories among them, changes no sample; it only saves calls (small tensors are overhead-bound).
    `keep` (bool [R'], or None): the group's rows are those of R' drawn rows that it keeps; the noise of all R'
    is drawn and the rest discarded, so a row's draws do not depend on which others are denoised.
    Returns [(states [T+1, R, D], log-probs [T, R])] per group.
    """
    sizes = [g[0].shape[0] for g in groups]
    drawn = [n if g[4] is None else len(g[4]) for n, g in zip(sizes, groups)]
    x = torch.cat([g[0] for g in groups])
    z_c = torch.cat([g[1] for g in groups])
    z_u = None if groups[0][2] is None else torch.cat([g[2] for g in groups])
    states, log_probs = [x.float()], []
    for i in range(sampler.num_steps):
        t = sampler.model_time(i).expand(x.shape[0]).to(x.device)
        out = guided_output(policy, x, t, z_c, z_u, scale).float()
        noise = None
        if bool(sampler.is_stochastic(i)):  # the draws the step would make from each group's generator, in order
            noise = torch.cat(
                [
                    _kept(torch.randn((n, x.shape[-1]), generator=g[3], dtype=torch.float32), g[4]).to(x.device)
                    for n, g in zip(drawn, groups)
                ]
            )
        step = sampler.step(out, i, x, temperature=temperature, variance_noise=noise)
        x = step.prev_sample
        states.append(x.float())
        log_probs.append(step.log_prob if step.log_prob is not None else torch.zeros(len(x), device=x.device))
    return list(zip(torch.stack(states).split(sizes, dim=1), torch.stack(log_probs).split(sizes, dim=1)))


def _kept(rows: Tensor, keep: Tensor | None) -> Tensor:
    return rows if keep is None else rows[keep.to(rows.device)]


def prompt_conditions(policy: MARPolicy, prompts: list[str], group_size: int, guided: bool):
    cond = policy.prepare_condition(policy.encode_prompts(prompts)).repeat(group_size)
    uncond = policy.prepare_condition(policy.null_condition(len(cond))) if guided else None
    return cond, uncond


def ar_pass(policy, tokens, known, cond: TextCondition, uncond: TextCondition | None):
    """z for the conditional and (if guided) unconditional branch in one transformer pass."""
    if uncond is None:
        return policy.ar_forward(tokens, known, cond), None
    z = policy.ar_forward(torch.cat([tokens, tokens]), torch.cat([known, known]), TextCondition.cat([cond, uncond]))
    return z.chunk(2)


_ar_pass_scopes: list = []  # `each_ar_pass_within`'s


@contextlib.contextmanager
def each_ar_pass_within(scope):
    """For the duration, every AR pass of a rollout runs inside `scope(policy)` (a context manager a pass): an
    instrument's (benchmarks/gradient_signal.py scales each AR step's use of the trained parameters)."""
    _ar_pass_scopes.append(scope)
    try:
        yield
    finally:
        _ar_pass_scopes.remove(scope)


def _ar_pass_scope(policy) -> contextlib.AbstractContextManager:
    if not _ar_pass_scopes:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for scope in list(_ar_pass_scopes):
        stack.enter_context(scope(policy))
    return stack


def _draw_orders(n_prompts: int, group_size: int, L: int, generator, shared: bool) -> Tensor:
    """A random generation order per image [N, L]; `shared`: one per prompt, repeated over its group."""
    if shared:
        return torch.argsort(torch.rand(n_prompts, L, generator=generator), dim=1).repeat_interleave(group_size, 0)
    return torch.argsort(torch.rand(n_prompts * group_size, L, generator=generator), dim=1)


@dataclass
class _Stream:
    """A run of consecutive prompts (and their groups' images) that draws from one pair of generators."""

    first: int  # first prompt
    count: int  # prompts
    generator: torch.Generator | None
    mte_generator: torch.Generator | None


def _streams(n_prompts: int, generator, mte_generator) -> list[_Stream]:
    """One stream for all prompts (one generator each), or one per prompt (lists of generators): a
    group's samples then depend on its own generators alone, not on which other groups share the batch."""
    if not isinstance(generator, (list, tuple)):
        return [_Stream(0, n_prompts, generator, mte_generator)]
    mte = mte_generator if isinstance(mte_generator, (list, tuple)) else [mte_generator] * len(generator)
    if len(generator) != n_prompts or len(mte) != n_prompts:
        raise ValueError(
            f"{len(generator)} generators and {len(mte)} MTE generators for {n_prompts} prompts: "
            "pass one generator, or one per prompt"
        )
    return [_Stream(i, 1, g, m) for i, (g, m) in enumerate(zip(generator, mte))]


def _split_rows(rows: tuple[Tensor, Tensor], streams: list[_Stream], group_size: int) -> list[tuple[Tensor, Tensor]]:
    """The (image, position) rows of each stream; `rows` is sorted by image, as nonzero() returns it."""
    if len(streams) == 1:
        return [rows]
    starts = torch.tensor([s.first * group_size for s in streams[1:]], device=rows[0].device)
    cuts = [0, *torch.searchsorted(rows[0], starts).tolist(), len(rows[0])]
    return [(rows[0][a:b], rows[1][a:b]) for a, b in zip(cuts, cuts[1:])]


@dataclass
class _Record:
    """The buffers generation fills step by step (the tensors of a Rollout)."""

    known: Tensor  # [K, N, L]
    committed: Tensor  # [K, N, L]
    states: Tensor  # [K, T + 1, N, L, D]
    log_probs: Tensor  # [K, T, N, L]
    mte_steps: Tensor | None  # [M'] sorted
    mte_states: Tensor | None  # [M', S-1, T + 1, N, L, D]
    mte_log_probs: Tensor | None  # [M', S-1, T, N, L]

    @classmethod
    def empty(cls, K: int, T: int, N: int, L: int, D: int, S1: int, mte_steps, device) -> _Record:
        known = torch.zeros(K, N, L, dtype=torch.bool, device=device)
        rec = cls(
            known,
            torch.zeros_like(known),
            torch.zeros(K, T + 1, N, L, D, device=device),
            torch.zeros(K, T, N, L, device=device),
            None,
            None,
            None,
        )
        if S1:
            steps = (
                torch.arange(K) if mte_steps is None else torch.as_tensor(mte_steps).long().cpu().unique()
            )  # sorted
            if len(steps) and not 0 <= int(steps[0]) <= int(steps[-1]) < K:
                raise ValueError(f"mte_steps {steps.tolist()} outside the {K} AR steps of this schedule")
            rec.mte_steps = steps
            rec.mte_states = torch.zeros(len(steps), S1, T + 1, N, L, D, device=device)
            rec.mte_log_probs = torch.zeros(len(steps), S1, T, N, L, device=device)
        return rec

    def mte_slot(self, k: int) -> int | None:
        """Where AR step k's extra trajectories go, or None when k draws none."""
        steps = [] if self.mte_steps is None else self.mte_steps.tolist()
        return steps.index(k) if k in steps else None


@torch.no_grad()
def generate(
    policy: MARPolicy,
    prompts: list[str],
    sampling: SamplingConfig,
    *,
    group_size: int = 1,
    generator: torch.Generator | list[torch.Generator] | None = None,
    trajectories: int = 1,
    mte_steps: Tensor | None = None,
    mte_generator: torch.Generator | list[torch.Generator] | None = None,
    shared_order: bool = False,
    shared_noise: bool = False,
    full_steps: Tensor | list[int] | None = None,
    ar_step_limit: int | None = None,
    on_record=None,
    before_ar_step=None,
) -> Rollout:
    """Generate group_size images per prompt and record the trajectory (design.md §3.2).

    With S = `trajectories` > 1, every AR step in `mte_steps` (default: all) also draws S - 1 more trajectories of
    each token it predicts, from the same z_k and guidance, in the committed trajectory's head calls (Algorithm 2),
    their noise from `mte_generator`: the committed trajectory and the images are the same for every S.
    `shared_order` / `shared_noise`: a group's images share one generation order / each token's initial noise.
    `generator` / `mte_generator` may be lists, one per prompt: each group draws from its own streams, so its samples
    do not depend on the batch it shares (data-parallel ranks split groups). `full_steps`: the AR steps that record
    every unknown token (default all; MTE's always). Hooks (grpo.step_hooks): `ar_step_limit`, `on_record` (a view of
    the record); `before_ar_step(k)` runs before AR step k (the trainer's stop check may raise to give it up).
    """
    if trajectories < 1:
        raise ValueError("trajectories (S) must be >= 1")
    with deterministic(policy):
        device = policy.device
        schedule = ar_schedule(policy, sampling)[:ar_step_limit]
        L, D = policy.seq_len, policy.token_dim
        sampler = make_sampler(policy, sampling)
        scales = cfg_scales(sampling, L, schedule)
        cond, uncond = prompt_conditions(policy, prompts, group_size, guided=sampling.cfg_scale != 1.0)
        streams = _streams(len(prompts), generator, mte_generator)
        orders = [_draw_orders(st.count, group_size, L, st.generator, shared_order) for st in streams]
        orders = torch.cat(orders).to(device)  # [N, L]
        N, S1 = len(orders), trajectories - 1
        rec = _Record.empty(len(schedule), sampling.diffusion_steps, N, L, D, S1, mte_steps, device)
        (on_record or _nothing)(rec)
        full = _full_steps(len(schedule), full_steps, rec.mte_steps if S1 else None)
        tokens = _ar_steps(
            policy,
            sampler,
            sampling,
            schedule,
            rec,
            full,
            streams,
            orders,
            (cond, uncond),
            scales,
            group_size,
            shared_noise,
            before_ar_step or _nothing,
        )
        return _as_rollout(policy, prompts, group_size, tokens, orders, rec, scales, sampling, full, full_steps)


def _nothing(*_) -> None:
    pass


def _as_rollout(policy, prompts, group_size, tokens, orders, rec, scales, sampling, full, full_steps) -> Rollout:
    """The finished record as a `Rollout`, the images decoded from the final latents."""
    device = tokens.device
    return Rollout(
        prompts=[p for p in prompts for _ in range(group_size)],
        latents=tokens,
        images=policy.decode(tokens),
        orders=orders,
        known=rec.known,
        committed=rec.committed,
        states=rec.states,
        log_probs=rec.log_probs,
        cfg=torch.tensor(scales),
        sampling=sampling,
        mte_steps=None if rec.mte_steps is None else rec.mte_steps.to(device),
        mte_states=rec.mte_states,
        mte_log_probs=rec.mte_log_probs,
        full=None if full_steps is None else full.to(device),
    )


def _ar_steps(
    policy,
    sampler,
    sampling,
    schedule,
    rec,
    full,
    streams,
    orders,
    conds,
    scales,
    group_size,
    shared_noise,
    before_step,
) -> Tensor:
    """Every AR step of a rollout into `rec`: the AR pass, the head's trajectories of the still-unknown tokens (every
    one at the steps in `full`), and the commitment of the step's tokens. Returns the final latents [N, L, D]."""
    (N, L), D, device = orders.shape, policy.token_dim, orders.device
    rank = torch.argsort(orders, dim=1)  # rank[n, j] = when token j is generated
    tokens = torch.zeros(N, L, D, device=device)
    known = torch.zeros(N, L, dtype=torch.bool, device=device)
    for k, (before, left) in enumerate(zip([L] + schedule, schedule)):  # unknown tokens before / after step k
        before_step(k)
        rec.known[k] = known
        rec.committed[k] = (rank >= L - before) & (rank < L - left)  # [N, L]
        with _ar_pass_scope(policy):
            z_c, z_u = ar_pass(policy, tokens, known, *conds)  # [N, L, W]
        rows = (~known).nonzero(as_tuple=True)  # every still-unknown token is predicted (completion mask)
        parts = _split_rows(rows, streams, group_size)
        xs = [
            _initial_noise(sampler, r, st, group_size if shared_noise else None, L, D, device)
            for r, st in zip(parts, streams)
        ]
        _denoise_step(
            policy,
            sampler,
            rec,
            k,
            parts,
            bool(full[k]),
            xs,
            z_c,
            z_u,
            float(scales[k]),
            sampling.temperature,
            streams,
        )
        tokens = torch.where(rec.committed[k][..., None], rec.states[k, -1], tokens)
        known = known | rec.committed[k]
    return tokens


def _full_steps(K: int, full_steps, mte_steps: Tensor | None) -> Tensor:
    """[K] bool (CPU): the AR steps that record every unknown token (all when `full_steps` is None)."""
    if full_steps is None:
        return torch.ones(K, dtype=torch.bool)
    steps = torch.as_tensor(full_steps, dtype=torch.long).cpu().flatten()
    if len(steps) and not 0 <= int(steps.min()) <= int(steps.max()) < K:
        raise ValueError(f"full_steps {steps.tolist()} outside the {K} AR steps of this schedule")
    full = torch.zeros(K, dtype=torch.bool)
    full[steps] = True
    if mte_steps is not None:  # MTE's S trajectories are of every predicted token
        full[mte_steps] = True
    return full


def _initial_noise(sampler: Sampler, rows, stream: _Stream, shared: int | None, L: int, D: int, device) -> Tensor:
    """x_T of one stream's unknown tokens `rows` [R, D]; `shared` (the group size): one draw per (prompt, position)."""
    if shared is None:
        return sampler.init_noise((len(rows[0]), D), generator=stream.generator, device=device)
    noise = sampler.init_noise((stream.count, L, D), generator=stream.generator, device=device)
    return noise[rows[0] // shared - stream.first, rows[1]]


def _denoise_step(
    policy,
    sampler: Sampler,
    rec: _Record,
    k: int,
    parts,
    full: bool,
    xs: list[Tensor],
    z_c: Tensor,
    z_u: Tensor | None,
    scale: float,
    temperature: float,
    streams: list[_Stream],
) -> None:
    """The head's full trajectory of every unknown token at AR step k (`full`), else of its committed ones alone,
    and MTE's extra ones, into `rec`; each stream's rows (`parts`) denoise with its own generators, all in the same
    head calls."""
    keeps = [None if full else rec.committed[k][r] for r in parts]  # per stream: which of its rows this step denoises
    parts = [r if keep is None else (r[0][keep], r[1][keep]) for r, keep in zip(parts, keeps)]
    xs = [_kept(x, keep) for x, keep in zip(xs, keeps)]
    groups = [
        (x, z_c[r], None if z_u is None else z_u[r], st.generator, keep)
        for r, x, st, keep in zip(parts, xs, streams, keeps)
    ]
    slot = rec.mte_slot(k)
    if slot is not None:  # MTE: same z_k, every predicted token, batched into the same head calls
        S1 = rec.mte_states.shape[1]
        groups += [
            _extra_group(sampler, r, z_c, z_u, S1, xs[0].shape[-1], st.mte_generator) for r, st in zip(parts, streams)
        ]
    results = _denoise_groups(policy, sampler, groups, scale, temperature)
    for r, (traj, lp) in zip(parts, results):
        rec.states[k][:, r[0], r[1]] = traj
        rec.log_probs[k][:, r[0], r[1]] = lp
    for r, (traj, lp) in zip(parts, results[len(parts) :]):
        _store_extra(r, rec.mte_states.shape[1], traj, lp, rec.mte_states[slot], rec.mte_log_probs[slot])


def _extra_group(sampler, rows, z_c, z_u, S1, D, generator):
    """S - 1 more trajectories of the predicted tokens `rows` from the same z_k (design.md §3.9): the rows to
    denoise."""
    x = sampler.init_noise((S1 * len(rows[0]), D), generator=generator, device=z_c.device)

    # [S1*R, W], trajectory-major
    def rep(z):
        return None if z is None else z[rows].repeat(S1, 1)

    return x, rep(z_c), rep(z_u), generator, None


def _store_extra(rows, S1, traj, lp, mte_states, mte_log_probs):
    """Write one MTE step's extra trajectories [T+1, S1*R, D] of its R predicted tokens into [S-1, T+1, N, L, D]."""
    R, D = len(rows[0]), traj.shape[-1]
    mte_states[:, :, rows[0], rows[1]] = traj.view(-1, S1, R, D).transpose(0, 1)
    mte_log_probs[:, :, rows[0], rows[1]] = lp.view(-1, S1, R).transpose(0, 1)
