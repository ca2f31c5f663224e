"""The one-step MAR policy: a toy MAR whose head is a one-step generator, and its generation loop.

`one_step_policy(teacher)` copies a toy-nova teacher and marks its head `head_sampler="one_step"`:
the student head starts as the teacher's MLP read at model time 1000 (pure noise), i.e. the teacher's
clean-token estimate E[x0 | z], and samples x = g(eps_0, z) + std * eps (`diffusion.one_step`).

`generate_one_step` is MAR's AR loop with one head call per AR step. Unlike `rollout.generate` it
is differentiable when called with gradients on: given the noise and the order, every token is a
smooth function of the parameters (committed tokens feed back into the AR transformer), which is
what MARVAL-RL's reward gradient needs. It also keeps each AR step's z (conditional and, for the
teacher's guidance, unconditional), which is where the distillation draws its contexts from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from margrpo.diffusion.common import gaussian_log_prob
from margrpo.diffusion.one_step import GENERATION_TIME
from margrpo.grpo.rollout import SamplingConfig, ar_schedule, cfg_scales
from margrpo.policy.base import TextCondition
from margrpo.policy.toy import ToyMAR


def one_step_policy(teacher: ToyMAR, std: float = 0.05) -> ToyMAR:
    """A copy of `teacher` (same AR transformer, text encoder and head weights) with a one-step head."""
    if teacher.config.head_type != "flow" or teacher.config.head_prediction != "x0":
        raise ValueError(
            "MARVAL distils a flow head that predicts x0 (toy-nova); got head_type="
            f"{teacher.config.head_type!r}, head_prediction={teacher.config.head_prediction!r}"
        )
    config = dataclasses.replace(teacher.config, head_sampler="one_step", one_step_std=std)
    student = ToyMAR(config, teacher.tokenizer)
    student.load_state_dict(teacher.state_dict())
    return student.to(teacher.device)


def student_tokens(policy: ToyMAR, noise: Tensor, z: Tensor) -> Tensor:
    """g(eps_0, z): the one-step head's token for input noise [N, D] and conditions [N, W]."""
    t = torch.full((noise.shape[0],), GENERATION_TIME, device=noise.device)
    return policy.head(noise, t, z).float()


@dataclass
class OneStepRollout:
    """A one-step generation. N images, K AR steps, L tokens of D channels, z of W channels."""

    prompts: list[str]  # [N]
    tokens: Tensor  # [N, L, D] final tokens (a function of the parameters when generated with gradients)
    images: Tensor  # [N, 3, H, W] in [0, 1]
    known: Tensor  # [K, N, L] bool, known before step k
    committed: Tensor  # [K, N, L] bool, committed at step k
    noise: Tensor  # [K, N, L, D] the generator's input eps_0 at each step
    samples: Tensor  # [K, N, L, D] x = g + std * eps at each step (detached), the actions of the Gaussian policy
    z_c: Tensor  # [K, N, L, W] conditional z (detached)
    z_u: Tensor | None  # [K, N, L, W] unconditional z (detached), when asked for
    cfg: Tensor  # [K] the teacher's guidance scale at each AR step


def _conditions(policy: ToyMAR, prompts: list[str], group_size: int, uncond: bool):
    cond = policy.prepare_condition(policy.encode_prompts(prompts)).repeat(group_size)
    return cond, policy.prepare_condition(policy.null_condition(len(cond))) if uncond else None


def _z(policy: ToyMAR, tokens: Tensor, known: Tensor, cond: TextCondition, uncond: TextCondition | None):
    """z of the conditional and (optionally) unconditional branch in one transformer pass."""
    if uncond is None:
        return policy.ar_forward(tokens, known, cond), None
    z = policy.ar_forward(torch.cat([tokens, tokens]), torch.cat([known, known]), TextCondition.cat([cond, uncond]))
    return z.chunk(2)


def generate_one_step(
    policy: ToyMAR,
    prompts: list[str],
    sampling: SamplingConfig,
    *,
    group_size: int = 1,
    generator: torch.Generator | None = None,
    with_uncond: bool = False,
) -> OneStepRollout:
    """MAR's AR loop with one generator call per AR step; differentiable under torch.enable_grad().

    The guidance is distilled into the student, so the student runs its conditional branch alone;
    `with_uncond` also computes the unconditional z (the teacher's CFG needs it during distillation).
    """
    device, L, D = policy.device, policy.seq_len, policy.token_dim
    schedule = ar_schedule(policy, sampling)
    K = len(schedule)
    cond, uncond = _conditions(policy, prompts, group_size, with_uncond)
    N = len(cond)
    orders = torch.argsort(torch.rand(N, L, generator=generator), dim=1).to(device)  # a random order per image
    rank = torch.argsort(orders, dim=1)  # rank[n, j] = when token j is generated
    noise = torch.randn(K, N, L, D, generator=generator).to(device)  # eps_0 per step and token
    eps = torch.randn(K, N, L, D, generator=generator).to(device)  # the Gaussian step's noise
    std = policy.config.one_step_std * sampling.temperature
    tokens = torch.zeros(N, L, D, device=device)
    known = torch.zeros(N, L, dtype=torch.bool, device=device)
    out = {k: [] for k in ("known", "committed", "samples", "z_c", "z_u")}
    for k, (before, left) in enumerate(zip([L] + schedule, schedule)):  # unknown tokens before / after step k
        committed = (rank >= L - before) & (rank < L - left)  # [N, L]
        z_c, z_u = _z(policy, tokens, known, cond, uncond)  # [N, L, W]
        rows = (~known).nonzero(as_tuple=True)  # the tokens still unknown: the head predicts them all
        g = torch.zeros(N, L, D, device=device).index_put(rows, student_tokens(policy, noise[k][rows], z_c[rows]))
        x = g + std * eps[k]  # [N, L, D] reparametrised Gaussian step
        tokens = torch.where(committed[..., None], x, tokens)
        for name, value in (
            ("known", known),
            ("committed", committed),
            ("samples", x.detach()),
            ("z_c", z_c.detach()),
            ("z_u", None if z_u is None else z_u.detach()),
        ):
            out[name].append(value)
        known = known | committed

    def stack(v):
        return None if v[0] is None else torch.stack(v)

    return OneStepRollout(
        prompts=[p for p in prompts for _ in range(group_size)],
        tokens=tokens,
        images=policy.decode(tokens),
        known=stack(out["known"]),
        committed=stack(out["committed"]),
        noise=noise,
        samples=stack(out["samples"]),
        z_c=stack(out["z_c"]),
        z_u=stack(out["z_u"]),
        cfg=torch.tensor(cfg_scales(sampling, L, schedule)),
    )


def committed_log_prob(policy: ToyMAR, rollout: OneStepRollout, temperature: float = 1.0) -> Tensor:
    """log pi(tokens) [N]: the sum over AR steps of the one-step Gaussian log-probs of the committed tokens.

    Replayed with the recorded tokens as fixed context (detached), so its gradient is the score function
    of the policy alone (REINFORCE), with no pathwise part through earlier tokens.
    """
    K, N, L = rollout.known.shape
    final = rollout.tokens.detach()
    cond = policy.prepare_condition(policy.encode_prompts(rollout.prompts)).tile(K)
    context = torch.where(rollout.known[..., None], final[None], torch.zeros_like(final[None]))  # [K, N, L, D]
    z = policy.ar_forward(context.flatten(0, 1), rollout.known.flatten(0, 1), cond).view(K, N, L, -1)
    k, n, l = rollout.committed.nonzero(as_tuple=True)  # noqa: E741  each token once: at the step that commits it
    mean = student_tokens(policy, rollout.noise[k, n, l], z[k, n, l])  # [R, D]
    std = torch.full((len(k), 1), policy.config.one_step_std * temperature, device=mean.device)
    lp = gaussian_log_prob(rollout.samples[k, n, l], mean, std)  # [R]
    return torch.zeros(N, device=lp.device).index_add(0, n, lp)
