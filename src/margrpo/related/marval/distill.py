"""MARVAL: distil the toy MAR's diffusion chain into one generation step (Gu et al., "Masked Auto-Regressive
Variational Acceleration: Fast Inference Makes Practical Reinforcement Learning", 2025, arXiv 2511.15190).

Three heads take part, all conditioned on the same per-token z of the frozen AR transformer:
the frozen teacher head (the pre-trained toy-nova flow head, read with classifier-free guidance at
the teacher's own per-AR-step scale), the one-step student g(eps_0, z) (initialised from the teacher
head) and an auxiliary "fake" score head (a copy of the teacher head) that tracks the score of the
student's own token distribution. They are optimised alternately, per iteration:

1. contexts: the student generates a batch (one head call per AR step, no gradient); every token
   still unknown at an AR step is a distillation row (z_c, z_u, CFG scale), as at inference;
2. fake score: the denoising (x0) loss of the fake head on noised student tokens, x_t = (1 - t) x + t eps;
3. student: the score-based variational loss below, at noised student tokens, with gradients to g.

Student objective. The paper names it Guided Score Implicit Matching (GSIM): Score Implicit Matching
(SIM, Luo et al. 2024) with the teacher's CFG score as the target. With y = s_teacher_cfg - s_fake at
x_t and the pseudo-Huber distance d(y) = sqrt(|y|^2 + c^2) - c, the SIM surrogate whose gradient is
that of E d(y) is  sg[d'(y)]^T (s_teacher_cfg(x_t) - grad log q_t(x_t | x)),  differentiated through
x and x_t (the teacher network is frozen but differentiated through). For the flow process
s(x_t) = -(x_t - (1 - t) x0_hat(x_t)) / t^2, so every score difference here is (1 - t) / t^2 times an
x0 difference; we measure y in x0 units (y = x0_cfg - x0_fake) and drop that factor, i.e. the time
weighting is w(t) = t^2 / (1 - t) of the score form, t ~ U[t_min, t_max]. `objective="sim"` is that;
`objective="dmd"` is the DMD / VSD gradient (x - x0_fake) - (x - x0_cfg) normalised by the mean
|x - x0_cfg| of the token (Yin et al. 2024), without the teacher's Jacobian.

Regression term (DMD's, Yin et al. 2024, "One-step Diffusion with Distribution Matching Distillation"). DMD
adds to the distribution-matching gradient a regression loss between the student's output and the teacher's
deterministic ODE output from the *same* noise: pairs (noise -> ODE(noise)) pin the student to a fixed
noise-to-image map, which the distribution terms alone do not supply (they only compare distributions, and a
student that starts as the teacher's posterior mean E[x0 | z], as ours does, barely depends on its noise).
Here the pairs are (z, eps_0) -> the teacher's Euler ODE (FlowSDESampler with noise_level = 0, the teacher's
diffusion_steps, its CFG at that AR step's scale) started at x_1 = eps_0, computed on line at each iteration's
rows (the toy head is cheap; DMD precomputes a dataset), and the distance is the per-channel MSE on tokens
(DMD uses LPIPS on images). `regression_weight` (default 1; 0 = off) weights it; the first `warm_start`
iterations use it alone (the fake head is still updated, so it tracks the student when the variational term
joins), afterwards it is added to the variational loss, as in DMD. MARVAL's paper (as far as we could read)
distils with the GSIM term alone and does not say it uses such pairs; this term is DMD's, our addition.

Where this may differ from the paper (whose text we could read only in summaries): the weighting
w(t), the time range, the Huber constant c (here in x0 units, per 768-channel token), the learning
rates and the number of fake-score updates per student update are our choices for the toy, not the
paper's numbers; the student's sample includes the one-step policy's Gaussian noise (std 0.05) so
that the distribution matched is the one GRPO samples.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor
from tqdm.auto import tqdm

from margrpo.diffusion.flow import FlowSDESampler
from margrpo.grpo.rollout import SamplingConfig
from margrpo.infra.files import atomic_dir, atomic_write_json, atomic_write_rows
from margrpo.policy.toy import ToyMAR
from margrpo.prompts.suites import PromptSet
from margrpo.related.marval.one_step import OneStepRollout, generate_one_step, one_step_policy, student_tokens

log = logging.getLogger(__name__)
OBJECTIVES = ("sim", "dmd")


@dataclass
class MARVALConfig:
    """The distillation's settings. The teacher's sampling (K, CFG scale and schedule) comes from its
    SamplingConfig."""

    steps: int = 300  # student updates
    batch_prompts: int = 8  # prompts per iteration (one student generation each)
    rows: int = 256  # distillation rows (unknown tokens at some AR step) per iteration, drawn from the generation
    objective: str = "sim"  # "sim" (GSIM, the paper's) or "dmd" (DMD / VSD gradient)
    huber_c: float = 1.0  # pseudo-Huber constant c of "sim", in x0 units per token
    t_min: float = 0.02  # noise times t ~ U[t_min, t_max] at which the scores are compared
    t_max: float = 0.98
    lr: float = 3e-4  # student (measured on the default toy-nova with the regression term: docs/marval.md)
    fake_lr: float = 3e-4  # auxiliary score head
    fake_steps: int = 2  # fake-score updates per student update (two time-scale, as DMD2)
    std: float = 0.05  # the one-step policy's Gaussian std (token units)
    grad_clip: float = 1.0
    save_every: int = 100
    seed: int = 0
    regression_weight: float = 1.0  # DMD's regression term on teacher ODE pairs (module docstring); 0 = off
    warm_start: int = 100  # first iterations with the regression term alone (needs regression_weight > 0)
    regression_rows: int = (
        128  # of the iteration's rows, how many get a teacher ODE target (20 guided head calls each)
    )

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"Unknown objective: {self.objective!r}; expected one of {OBJECTIVES}")
        if not 0 < self.t_min < self.t_max < 1:
            raise ValueError(f"need 0 < t_min < t_max < 1, got t_min={self.t_min}, t_max={self.t_max}")
        if min(self.steps, self.batch_prompts, self.rows, self.fake_steps, self.save_every, self.regression_rows) < 1:
            raise ValueError("steps, batch_prompts, rows, fake_steps, save_every and regression_rows must be >= 1")
        if not (self.huber_c > 0 and self.lr > 0 and self.fake_lr > 0 and self.std > 0):
            raise ValueError("huber_c, lr, fake_lr and std must be > 0")
        if self.regression_weight < 0 or self.warm_start < 0 or (self.warm_start and not self.regression_weight):
            raise ValueError(
                "regression_weight and warm_start must be >= 0, and a warm start needs regression_weight > 0"
            )


@dataclass
class Rows:
    """Distillation rows: one unknown token of one AR step each. R rows, z of W channels."""

    z_c: Tensor  # [R, W]
    z_u: Tensor  # [R, W]
    cfg: Tensor  # [R] the teacher's guidance scale at that AR step


def draw_rows(rollout: OneStepRollout, n: int, generator: torch.Generator) -> Rows:
    """Up to n of the rollout's (AR step, unknown token) pairs, uniformly without replacement."""
    k, i, j = (~rollout.known).nonzero(as_tuple=True)
    pick = torch.randperm(len(k), generator=generator)[:n].to(k.device)
    k, i, j = k[pick], i[pick], j[pick]
    return Rows(rollout.z_c[k, i, j], rollout.z_u[k, i, j], rollout.cfg.to(k.device)[k].float())


def x0_prediction(mlp, x_t: Tensor, t: Tensor, z: Tensor) -> Tensor:
    """A toy flow head's clean-token estimate (its MLP predicts x0) at flow time t [R] in (0, 1)."""
    return mlp(x_t, t * 1000, z)[:, : x_t.shape[-1]].float()


def guided_x0(mlp, x_t: Tensor, t: Tensor, rows: Rows) -> Tensor:
    """The teacher's CFG estimate x0_u + s (x0_c - x0_u), per row's scale (linear in x0 as in v or eps)."""
    both = x0_prediction(mlp, torch.cat([x_t, x_t]), torch.cat([t, t]), torch.cat([rows.z_c, rows.z_u]))
    x0_c, x0_u = both.chunk(2)
    return x0_u + rows.cfg[:, None] * (x0_c - x0_u)


def noised(x: Tensor, t: Tensor, generator: torch.Generator | None) -> Tensor:
    """x_t = (1 - t) x + t eps, the flow head's forward process."""
    eps = torch.randn(x.shape, generator=generator).to(x.device)
    return (1 - t[:, None]) * x + t[:, None] * eps


def fake_score_loss(fake, x: Tensor, t: Tensor, z_c: Tensor, generator=None) -> Tensor:
    """Denoising loss of the fake head on (detached) student tokens x [R, D]: it learns the student's score."""
    x = x.detach()
    return ((x0_prediction(fake, noised(x, t, generator), t, z_c) - x) ** 2).mean()


def generator_loss(
    objective: str, teacher, fake, x: Tensor, t: Tensor, rows: Rows, huber_c: float, generator=None
) -> Tensor:
    """The student's variational loss at its tokens x [R, D] (with gradients): see the module docstring."""
    x_t = noised(x, t, generator)
    with torch.no_grad():
        x0_fake = x0_prediction(fake, x_t, t, rows.z_c)
    if objective == "sim":
        x0_cfg = guided_x0(teacher, x_t, t, rows)  # differentiated through x_t
        y = (x0_cfg - x0_fake).detach()  # s_teacher_cfg - s_fake, in x0 units
        d_prime = y / torch.sqrt((y**2).sum(-1, keepdim=True) + huber_c**2)  # pseudo-Huber d'(y)
        return (d_prime * (x0_cfg - x)).sum(-1).mean()  # sg[d']^T (s_teacher(x_t) - grad log q(x_t | x))
    if objective == "dmd":
        with torch.no_grad():
            x0_cfg = guided_x0(teacher, x_t, t, rows)
            scale = (x - x0_cfg).abs().mean(-1, keepdim=True).clamp(min=1e-6)
            target = x - (x0_fake - x0_cfg) / scale
        return 0.5 * ((x - target) ** 2).sum(-1).mean()
    raise ValueError(f"Unknown objective: {objective!r}; expected one of {OBJECTIVES}")


@torch.no_grad()
def teacher_ode(teacher_head, rows: Rows, noise: Tensor, steps: int = 20) -> Tensor:
    """The teacher's deterministic sample [R, D] of each row from its initial noise x_1 = noise [R, D]: the
    Euler ODE (FlowSDESampler, noise_level = 0) of `steps` steps with the row's CFG, as the teacher samples."""
    sampler = FlowSDESampler(num_steps=steps, noise_level=0.0)
    x = noise.float()
    for i in range(steps):
        t = sampler.sigmas[i].float().expand(len(x)).to(x.device)
        v = (x - guided_x0(teacher_head, x, t, rows)) / t[:, None]  # x0-prediction to velocity
        x = sampler.step(v, i, x).prev_sample
    return x


def repeat_rows(rows: Rows, n: int) -> Rows:
    return Rows(rows.z_c.repeat(n, 1), rows.z_u.repeat(n, 1), rows.cfg.repeat(n))


@torch.no_grad()
def teacher_distance(
    teacher_head, student: ToyMAR, rows: Rows, draws: int = 8, steps: int = 20, seed: int = 0
) -> dict:
    """How far the one-step student's token distribution is from the teacher's at the same z: the per-channel
    mean squared gaps of the per-row means and stds over `draws` samples each (a moment distance), and
    `paired`: the per-channel MSE between g(eps_0, z) and the teacher's ODE sample from the same eps_0."""
    g = torch.Generator().manual_seed(seed)
    R, D = len(rows.cfg), teacher_head.input_proj.in_features
    noise = torch.randn(draws * R, D, generator=g).to(rows.z_c.device)
    eps = torch.randn(draws * R, D, generator=g).to(rows.z_c.device)
    many = repeat_rows(rows, draws)
    ref = teacher_ode(teacher_head, many, noise, steps)
    mean = student_tokens(student, noise, many.z_c)
    own = (mean + student.config.one_step_std * eps).view(draws, R, D)
    paired = ((mean - ref) ** 2).mean().item()
    ref = ref.view(draws, R, D)
    mean_gap = ((own.mean(0) - ref.mean(0)) ** 2).mean().item()
    std_gap = ((own.std(0) - ref.std(0)) ** 2).mean().item()
    return {"mean_gap": mean_gap, "std_gap": std_gap, "distance": mean_gap + std_gap, "paired": paired}


def _item(loss: Tensor | None) -> float:
    return float("nan") if loss is None else loss.item()


class MARVALDistiller:
    """Alternating optimisation of the one-step student and the fake score head against a frozen teacher."""

    def __init__(self, teacher: ToyMAR, sampling: SamplingConfig, config: MARVALConfig, student: ToyMAR | None = None):
        self.cfg, self.sampling = config, sampling
        self.teacher_head = teacher.diffloss.requires_grad_(False).eval()
        self.student = student if student is not None else one_step_policy(teacher, config.std)
        self.student.requires_grad_(False)
        self.student.diffloss.requires_grad_(True)  # the AR transformer and the text encoder stay frozen
        self.fake = copy.deepcopy(self.teacher_head).requires_grad_(True).train()
        self.opt = torch.optim.AdamW(self.student.diffloss.parameters(), lr=config.lr, weight_decay=0.0)
        self.fake_opt = torch.optim.AdamW(self.fake.parameters(), lr=config.fake_lr, weight_decay=0.0)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.step, self.rows = 0, []

    def contexts(self, prompts: list[str]) -> Rows:
        """Step 1: a student generation without gradients; its (AR step, unknown token) rows."""
        with torch.no_grad():
            rollout = generate_one_step(
                self.student.eval(), prompts, self.sampling, generator=self.generator, with_uncond=True
            )
        return draw_rows(rollout, self.cfg.rows, self.generator)

    def sample(self, rows: Rows) -> Tensor:
        """Student tokens x = g(eps_0, z_c) + std * eps for the rows [R, D], with gradients to g."""
        noise = torch.randn(len(rows.cfg), self.student.token_dim, generator=self.generator).to(rows.z_c.device)
        eps = torch.randn(noise.shape, generator=self.generator).to(noise.device)
        return student_tokens(self.student, noise, rows.z_c) + self.cfg.std * eps

    def times(self, n: int, device) -> Tensor:
        return (self.cfg.t_min + (self.cfg.t_max - self.cfg.t_min) * torch.rand(n, generator=self.generator)).to(
            device
        )

    def fake_update(self, rows: Rows) -> float:
        """Step 2: one denoising update of the fake head on fresh student tokens."""
        with torch.no_grad():
            x = self.sample(rows)
        loss = fake_score_loss(self.fake, x, self.times(len(x), x.device), rows.z_c, self.generator)
        self.fake_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.fake.parameters(), self.cfg.grad_clip)
        self.fake_opt.step()
        return loss.item()

    def student_loss(self, rows: Rows) -> Tensor:
        """Step 3's variational loss (also MARVAL-RL's regulariser)."""
        x = self.sample(rows)
        return generator_loss(
            self.cfg.objective,
            self.teacher_head,
            self.fake,
            x,
            self.times(len(x), x.device),
            rows,
            self.cfg.huber_c,
            self.generator,
        )

    def regression_loss(self, rows: Rows) -> Tensor:
        """DMD's regression term: 0.5 |g(eps_0, z) - ODE(eps_0)|^2 per token (the scale of the "dmd" loss), mean
        over `regression_rows` of the rows, the target being the teacher's ODE sample from the same eps_0."""
        n = min(self.cfg.regression_rows, len(rows.cfg))
        rows = Rows(rows.z_c[:n], rows.z_u[:n], rows.cfg[:n])  # draw_rows already shuffled them
        noise = torch.randn(n, self.student.token_dim, generator=self.generator).to(rows.z_c.device)
        target = teacher_ode(self.teacher_head, rows, noise, self.sampling.diffusion_steps)
        return 0.5 * ((student_tokens(self.student, noise, rows.z_c) - target) ** 2).sum(-1).mean()

    def train_step(self, prompts: list[str]) -> dict:
        """One iteration: contexts, `fake_steps` fake-score updates, one student update (variational + regression)."""
        t0 = time.time()
        rows = self.contexts(prompts)
        fake_losses = [self.fake_update(rows) for _ in range(self.cfg.fake_steps)]
        var = self.student_loss(rows) if self.step >= self.cfg.warm_start else None
        reg = self.regression_loss(rows) if self.cfg.regression_weight else None
        loss = sum(w * v for v, w in ((var, 1.0), (reg, self.cfg.regression_weight)) if v is not None)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.student.diffloss.parameters(), self.cfg.grad_clip).item()
        if math.isfinite(loss.item()) and math.isfinite(grad_norm):
            self.opt.step()
        self.step += 1
        return {
            "step": self.step,
            "student_loss": loss.item(),
            "var_loss": _item(var),
            "reg_loss": _item(reg),
            "fake_loss": sum(fake_losses) / len(fake_losses),
            "grad_norm": grad_norm,
            "rows": len(rows.cfg),
            "step_time_s": time.time() - t0,
        }

    def train(self, prompts: PromptSet, out_dir: str | Path | None = None) -> list[dict]:
        """Distil for `cfg.steps` iterations; writes `policy/` (the one-step policy) and metrics.csv atomically."""
        order = torch.Generator().manual_seed(self.cfg.seed + 1)
        bar = tqdm(total=self.cfg.steps, initial=self.step, desc="marval", mininterval=5)
        while self.step < self.cfg.steps:
            idx = torch.randperm(len(prompts), generator=order)[: self.cfg.batch_prompts].tolist()
            row = self.train_step([prompts.prompts[i] for i in idx])
            self.rows.append(row)
            bar.update(1)
            bar.set_postfix(student=f"{row['student_loss']:.3f}", fake=f"{row['fake_loss']:.4f}")
            if out_dir is not None and (self.step % self.cfg.save_every == 0 or self.step == self.cfg.steps):
                self.save(out_dir)
        bar.close()
        return self.rows

    def save(self, out_dir: str | Path) -> None:
        """out_dir/policy (loads with margrpo.policy.load_policy), metrics.csv and marval.json, each atomically."""
        out = Path(out_dir)
        with atomic_dir(out / "policy") as tmp:
            self.student.save_pretrained(tmp)
        atomic_write_rows(out / "metrics.csv", self.rows)
        atomic_write_json(
            out / "marval.json", {"step": self.step, "config": asdict(self.cfg), "sampling": asdict(self.sampling)}
        )
        log.info("MARVAL step %d: one-step policy written to %s", self.step, out / "policy")
