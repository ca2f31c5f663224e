"""The one GRPO trainer: every policy plugs in through the MAR policy interface (design.md §3).

A step (`train_step`, then `update` for each optimizer step; read top-down): sample prompts -> choose |M| AR steps
and |T| diffusion steps -> rollout with CFG (recording the trajectory, and S trajectories for MTE) -> rewards ->
group advantages -> for each micro-batch and replay chunk, the log-probs recomputed there in batched passes and the
clipped surrogate with the MTE and Sim masks plus beta * KL to the frozen reference (`micro_loss`), backpropagated
-> clip, guard, one optimizer step. Variants (grpo / fix / mte / sim) are config switches. A stop request inside a
step gives it up before its first optimizer step (`StepGuard`); the run loop saves the state of its start.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
from accelerate import Accelerator

from margrpo.grpo.build import build_parts
from margrpo.grpo.checkpoints import legacy_resume_key, record_hash, resume_record
from margrpo.grpo.config import GRPOConfig, check_chosen_steps
from margrpo.grpo.grad_stats import grad_square_norm
from margrpo.grpo.objective import group_advantages
from margrpo.grpo.random_streams import Stream, group_generators, step_generator
from margrpo.grpo.replay import Replay, completion_mask, recorded, replay
from margrpo.grpo.rollout import (
    Rollout,
    SamplingConfig,
    ar_schedule,
    generate,
    make_sampler,
    stochastic_steps,
)
from margrpo.grpo.run_files import RunState, step_row, write_run_outputs
from margrpo.grpo.run_loop import Cadence, StepAbandoned, run_loop
from margrpo.grpo.step_hooks import StepHooks
from margrpo.grpo.step_plan import Backward, StepBatch, Update, choose_steps, subset_rollout
from margrpo.grpo.step_stats import micro_batch_stats, update_columns, update_log
from margrpo.grpo.validation import validation_rewards
from margrpo.grpo.variants import (
    LossInputs,
    OldLogProbs,
    TokenCounts,
    loss_weights,
    micro_batch_loss,
    variant_masks,
)
from margrpo.infra.files import refuse_symlink
from margrpo.infra.stopping import StopRequest
from margrpo.infra.trackers import end_trackers, log_image_grid, start_trackers
from margrpo.policy.base import MARPolicy
from margrpo.policy.lora import adapters_disabled
from margrpo.policy.settings import PolicySettings
from margrpo.prompts.suites import PromptSet
from margrpo.rewards.registry import RewardFn

RUN_NAME = "grpo"  # the trackers' run: <out>/tb/grpo/
log = logging.getLogger(__name__)


class StepGuard:
    """The stop check at the fixed points of a step (before each AR step of the rollout, before and after scoring,
    before each backward pass of the first update), armed from the step's start until its first optimizer step
    begins: where any process was told to stop (a signal; the time limit is read between steps), every process
    gives the step up together (`StepAbandoned`). Free unless armed; one process reads a flag, several agree
    through one all-reduce of one float per check (a collective at the same points on each: the steps' shapes are
    the same on every process)."""

    def __init__(self, engine):
        self.engine, self.stop, self.armed = engine, None, False
        self.at = ""  # where the step was given up (the log says it: a stop in mid-rollout is told from one later)

    def __call__(self, at: str) -> None:
        if not self.armed:
            return
        mine = self.stop.signalled  # read once: a signal may come at any time
        if self.engine.any_process(mine is not None):
            self.armed, self.at = False, at
            raise StepAbandoned(f"{mine} received" if mine else "another process was asked to stop")


class GRPOTrainer:
    def __init__(
        self,
        policy: MARPolicy,
        reward_fn: RewardFn,
        train_prompts: PromptSet,
        val_prompts: PromptSet,
        sampling: SamplingConfig,
        config: GRPOConfig,
        out_dir: str | Path,
        accelerator: Accelerator | None = None,
        device: torch.device | str | None = None,
        policy_settings: PolicySettings | None = None,
        hooks: StepHooks | None = None,
    ):
        self.cfg, self.sampling = config, sampling
        self.policy_settings = policy_settings or PolicySettings()  # frozen parts, memory levers, sharding
        # where the policy runs: its parameters' device, unless they wait on the meta device (parallel.build_policy)
        self.device = torch.device(device) if device is not None else policy.device
        # accelerate for the trackers alone: processes, devices and state are the engine's (grpo.engine)
        self.accelerator = accelerator or Accelerator(
            cpu=self.device.type == "cpu", log_with=list(config.trackers) or None, project_dir=Path(out_dir) / "tb"
        )
        self.policy = policy
        if config.batch_prompts > len(train_prompts):
            raise ValueError(
                f"grpo.batch_prompts ({config.batch_prompts}) exceeds the {len(train_prompts)} training prompts"
            )
        self.reward_fn, self.train_prompts, self.val_prompts = reward_fn, train_prompts, val_prompts
        self.out_dir = Path(out_dir)
        self.state_dir = self.out_dir / "state"
        self.ar_steps = len(ar_schedule(policy, sampling))  # K of every rollout (NOVA's rounding may drop steps)
        self.sampler = make_sampler(policy, sampling)
        check_chosen_steps(config, self.ar_steps, stochastic_steps(sampling))
        parts = build_parts(policy, config, self.policy_settings, self.device, self.state_dir)  # grpo.build
        self.engine, self.ref, self.params, self.stat_params = parts.engine, parts.ref, parts.params, parts.stat_params
        self.probe, self.optimizer, self.checkpointer = parts.probe, parts.optimizer, parts.checkpointer
        self.ema = parts.ema  # the average of the trained parameters (grpo.ema_decay), or None
        self.hooks = hooks or StepHooks()  # an instrument's view of each step (grpo.step_hooks; margrpo plan's)
        self.groups = parts.groups  # data parallel: this process rolls out these prompt groups of every batch
        self.run, self.nonfinite_run = RunState(), 0  # steps run, their rows, the validations (grpo.run_loop)
        self.stopped: str | None = None  # why `train` saved and stopped early (None: it ran to the end)
        self.stop_request: StopRequest | None = None
        self.guard = StepGuard(self.engine)  # armed in `train_step` where there is a stop request
        self.spec: dict | None = None  # the stage's spec (inputs, variant), set by `train`
        self.record = self.run_record(None)
        self.spec_hash = record_hash(self.record)  # the run's key (the trackers' run id)

    def run_record(self, spec: dict | None) -> dict:
        """This run's settings, one entry each, as a resume compares them (grpo.checkpoints.resume_record): these
        configs and the stage's `spec`."""
        return resume_record(self.settings(), asdict(self.sampling), spec)

    def settings(self) -> dict:
        """The GRPO settings and the policy's, in one flat record (summary.json's `config`, the trackers')."""
        return {**asdict(self.cfg), **asdict(self.policy_settings)}

    def train(self, spec: dict | None = None, stop: StopRequest | None = None, restart: bool = False) -> dict:
        """Train to `cfg.steps`, resuming state/ where its settings (these configs and the stage's `spec`) give the
        same steps; else stop, or with `restart` move it aside (grpo.checkpoints). With `stop`, save and stop early
        (`self.stopped` says why) when any process's request says the next step would not end in time."""
        self.spec, self.record = spec, self.run_record(spec)
        self.spec_hash = record_hash(self.record)
        refuse_symlink(self.state_dir, "state folder")  # a restart moves what is in it
        if self.engine.is_main:
            self.state_dir.mkdir(parents=True, exist_ok=True)
        resumed = self.try_resume(restart)
        wandb = {"name": self.out_dir.name, "id": f"{self.out_dir.name}-{self.spec_hash}", "config": self.settings()}
        start_trackers(self.accelerator, self.out_dir / "tb", RUN_NAME, self.step if resumed else None, wandb=wandb)
        if not resumed:  # the loop validates the base policy first
            self.rows, self.checkpoints = [], []
        self.stop_request = self.guard.stop = stop
        cadence = Cadence(self.cfg.steps, self.cfg.val_every, self.cfg.save_every)
        self.stopped = run_loop(self, self.run, cadence, f"grpo[{self.cfg.seed}]", show=self.engine.is_main)
        end_trackers(self.accelerator)
        return self.rows

    # --- the run loop's side (grpo.run_loop): the run's state, a step, trackers, stopping ----------------------------
    step = property(lambda self: self.run.step, lambda self, v: setattr(self.run, "step", v))
    rows = property(lambda self: self.run.rows, lambda self, v: setattr(self.run, "rows", v))
    checkpoints = property(lambda self: self.run.checkpoints, lambda self, v: setattr(self.run, "checkpoints", v))

    def log(self, row: dict) -> None:
        self.accelerator.log(
            {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}, step=self.step
        )

    def should_stop(self, next_seconds: float) -> str | None:
        """Why to save and stop before a step of `next_seconds`: any process's stop request says so; all agree, or a
        collective would wait for the ones that left."""
        if self.stop_request is None:  # every process alike: no collective
            return None
        why = self.stop_request.reason(next_seconds)
        if not self.engine.any_process(why is not None):
            return None
        why = why or "another process was asked to stop"
        log.warning("saving and stopping at step %d of %d: %s", self.step, self.cfg.steps, why)
        return why

    # --- one GRPO step (design.md §3) ------------------------------------------------------------------------------
    def train_step(self) -> dict:
        """One GRPO step: rollout and rewards -> group advantages (with MTE's extra trajectories and Sim's weights)
        -> each optimizer step of the rollout -> the step's row. Given up (StepAbandoned) where the guard says so,
        with its gradients and any gathered weights dropped: the parameters and optimizer are the step's start's."""
        t0 = time.time()
        self.guard.armed = self.stop_request is not None
        try:
            batch = self.rollout_and_score()
            logs = [self.update(batch, update) for update in self.plan_updates(batch)]
        except StepAbandoned as why:
            log.warning(
                "giving up step %d in progress (%s), saving the state of its start: %s",
                self.step + 1,
                self.guard.at,
                why,
            )
            self.optimizer.zero_grad(set_to_none=True)
            self.engine.release_gathered()
            raise
        finally:
            self.guard.armed = False
        return self.step_row(batch, update_columns(logs), time.time() - t0)

    def update(self, batch: StepBatch, update: Update) -> dict:
        """One optimizer step on the batch gradient (`accumulate`), then clip, guard and step."""
        done = self.accumulate(batch, update)
        self.guard.armed = False  # the optimizer step begins: the step is no longer given up
        square_norm_ar = grad_square_norm(self.stat_params, self.engine)  # before clipping: Fig. 2a / 5
        # the total norm of every trained gradient, clipped to grad_clip (0: measured only; a scale of exactly 1)
        grad_norm = self.engine.clip_grad_norm(self.params, self.cfg.grad_clip or math.inf)
        micro_batches = micro_batch_stats(done)
        total = float(self.engine.all_sum(torch.tensor(sum(loss for loss, _ in micro_batches), dtype=torch.float64)))
        finite = math.isfinite(total) and math.isfinite(grad_norm)
        self.nonfinite_run = 0 if finite else self.nonfinite_run + 1
        if finite:
            self.optimizer.step()
        elif self.nonfinite_run >= self.cfg.max_nonfinite:
            raise FloatingPointError(
                f"{self.nonfinite_run} non-finite updates in a row at step {self.step}; stopping (grpo.max_nonfinite)"
            )
        norms = dict(grad_norm=grad_norm, grad_norm_ar=math.sqrt(square_norm_ar), **self.probe.columns(square_norm_ar))
        stats = [s for part in self.engine.all_objects([s for _, s in micro_batches]) for s in part]
        return update_log(stats, self.cfg.kl, batch, update, self.engine.all_sum, **norms, skipped=int(not finite))

    def accumulate(self, batch: StepBatch, update: Update) -> list[tuple[Backward, float, dict]]:
        """The update's batch gradient into .grad (cleared first): every micro-batch's loss backpropagated, one
        replay chunk at a time (their gradients sum to the batch's, over every process). Returns each backward
        pass with its loss and stats. `update` steps on it; grpo.gradient_estimates reads it."""
        self.optimizer.zero_grad(set_to_none=True)
        self.probe.start()
        done = []  # (backward, its loss, its stats)
        for i, part in enumerate(self.hooks.replays(self.backwards(batch, update))):
            self.guard(f"before backward pass {i + 1} of the first update")
            with self.engine.sync(self.engine.reduces(part.last_micro_batch, part.last_chunk)):
                loss, stats = self.engine.forward(partial(self.micro_loss, part.inputs))
                (loss * part.share).backward()
            done.append((part, loss.item(), stats))
            if part.last_chunk:
                self.probe.after_micro_batch(last=part.last_micro_batch)
        return done

    def rollout_and_score(self, step: int | None = None) -> StepBatch:
        """Sample prompts, roll out their groups, score them, and derive advantages and the MTE / Sim masks: the
        batch of `step` (its random streams are keyed by it; None: the run's next step)."""
        cfg, step = self.cfg, self.step if step is None else step
        self.hooks.rolling_out()
        g_prompts, g_steps = (step_generator(cfg.seed, step, s) for s in (Stream.PROMPTS, Stream.STEPS))
        chosen = torch.randperm(len(self.train_prompts), generator=g_prompts)[: cfg.batch_prompts].tolist()
        idx = [chosen[i] for i in self.groups]  # this process's groups; each draws from its own streams
        g_roll = group_generators(cfg.seed, step, Stream.ROLLOUT, self.groups)
        g_mte = group_generators(cfg.seed, step, Stream.MTE, self.groups) if cfg.trajectories > 1 else None
        prompts = [self.train_prompts.prompts[i] for i in idx]
        meta = [self.train_prompts.metadata[i] for i in idx for _ in range(cfg.group_size)]
        # the |M| AR steps are chosen before the rollout: MTE draws its S - 1 extra trajectories there (Algorithm 2)
        ar, diff = self.hooks.chosen(*self.choose_steps(g_steps))
        with self.engine.autocast():
            rollout = generate(
                self.policy,
                prompts,
                self.sampling,
                group_size=cfg.group_size,
                generator=g_roll,
                trajectories=cfg.trajectories,
                mte_steps=ar,
                mte_generator=g_mte,
                shared_order=cfg.group_order == "shared",
                shared_noise=cfg.group_noise == "shared",
                full_steps=self.recorded_steps(ar),
                ar_step_limit=self.hooks.ar_step_limit,
                on_record=self.hooks.recorded,
                before_ar_step=self.before_ar_step,
            )
        self.guard("before scoring")
        rewards, components = self.reward_fn(rollout.images, rollout.prompts, meta)
        self.guard("after scoring")
        adv, frac_zero = group_advantages(rewards, cfg.group_size)
        if cfg.advantages == "shuffled":  # the no-signal control (GRPOConfig.advantages)
            shuffle = torch.randperm(len(adv), generator=step_generator(cfg.seed, step, Stream.SHUFFLE))
            adv = adv[shuffle.to(adv.device)]
        mte_mask, sim_keep = self.masks(rollout)
        rows = torch.arange(len(rollout.prompts)).chunk(cfg.micro_batches)
        batch = StepBatch(
            rollout=rollout,
            subs=[subset_rollout(rollout, r) for r in rows],
            rows=rows,
            rewards=rewards,
            components=components,
            adv=adv,
            frac_zero=frac_zero,
            ar_steps=ar,
            diffusion_steps=diff,
            mte_mask=mte_mask,
            sim_keep=sim_keep,
        )
        self.hooks.scored(batch)
        return batch

    def before_ar_step(self, k: int) -> None:
        """An instrument's view of the rollout's AR step k, then the stop check, before its pass."""
        self.hooks.ar_step(k)
        self.guard(f"in the rollout, before AR step {k + 1} of {self.sampling.ar_steps}")

    def plan_updates(self, batch: StepBatch) -> list[Update]:
        """The optimizer steps of this rollout, each over all chosen AR steps (`updates_per_rollout`; one
        under `reinforce`, as the official code), with the log_prob_old each one uses and the batch's loss tokens.

        log_prob_old comes from the parameters before the first optimizer step. The first update runs on
        exactly those and reads them off its own pass (None); later updates need a no-grad pass now."""
        ar, diff, n = batch.ar_steps, batch.diffusion_steps, self.cfg.updates_per_rollout
        completion = completion_mask(batch.rollout, ar, diff, self.sampler)  # the whole batch's
        tokens, weight = loss_weights(completion, batch.rollout, ar, batch.sim_keep, self.cfg.loss_tokens)
        counts = TokenCounts(self.engine.all_sum(weight.sum((1, 2, 3))), self.engine.all_sum(tokens.sum((1, 2, 3))))
        first = Update(ar, diff, [None] * len(batch.rows), tokens, counts)
        if n == 1:
            return [first]
        old = [  # every later update is over the same steps: one pass serves them all
            self.old_log_probs(sub, ar, diff, batch.micro_batch_mask(batch.mte_mask, c))
            for c, sub in enumerate(batch.subs)
        ]
        return [first] + [Update(ar, diff, old, tokens, counts)] * (n - 1)

    def backwards(self, batch: StepBatch, update: Update) -> Iterator[Backward]:
        """The backward passes of one update: each micro-batch's images at `grpo.replay_chunk` chosen AR steps at a
        time, so that one chunk's activations are freed before the next is replayed (all |M| at once is what
        outgrows a GPU at the paper's batch). A chunk's loss is its share of the mean over steps (the whole of the
        sum under `reinforce`), so the passes' gradients sum to the batch gradient."""
        M, n = len(update.ar_steps), len(batch.rows)
        size = self.cfg.replay_chunk or M
        for c, rows in enumerate(batch.rows):
            for start in range(0, M, size):
                part = slice(start, start + size)
                inputs = LossInputs(
                    rollout=batch.subs[c],
                    adv=batch.adv[rows],
                    ar_steps=update.ar_steps[part],
                    diffusion_steps=update.diffusion_steps[part],
                    mte_mask=batch.micro_batch_mask(batch.mte_mask, c),
                    sim_keep=batch.micro_batch_mask(batch.sim_keep, c),
                    old=None if update.old[c] is None else update.old[c].steps(part),
                    counts=update.counts.steps(part),
                )
                yield Backward(
                    index=c,
                    inputs=inputs,
                    share=1.0 if self.cfg.reinforce or size >= M else len(update.ar_steps[part]) / M,
                    selected=0 if size >= M else update.tokens[part][:, :, rows].count_nonzero().item(),
                    last_chunk=start + size >= M,
                    last_micro_batch=c == n - 1,
                )

    def micro_loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict]:
        """Loss of one micro-batch (already a sub-rollout, `inputs`: variants.LossInputs): its chosen steps replayed
        under the policy (with gradients) and the frozen reference, then `variants.micro_batch_loss`, the method's
        loss (design.md §3.5-3.10)."""
        replayed = self._replay(inputs.rollout, inputs.ar_steps, inputs.diffusion_steps, inputs.mte_mask)
        return micro_batch_loss(inputs, replayed, self._reference(inputs), self.cfg)

    @torch.no_grad()
    def _reference(self, x: LossInputs) -> Replay | None:
        """The frozen reference's replay of the same steps, the KL's other side (None: no reference, beta = 0)."""
        if self.ref is None:
            return None
        with self.engine.autocast(), adapters_disabled(self.ref):
            return replay(self.ref, x.rollout, x.ar_steps, x.diffusion_steps, logprob_cfg=self.cfg.logprob_cfg)

    @torch.no_grad()
    def old_log_probs(
        self,
        rollout: Rollout,
        ar_steps: torch.Tensor,
        diffusion_steps: torch.Tensor,
        mte_mask: torch.Tensor | None = None,
    ) -> OldLogProbs:
        """log_prob_old of one micro-batch at the current parameters: the record's, or a no-grad pass of
        the training replay (the same arithmetic as the update's own pass)."""
        if self.cfg.old_logprob == "recorded":
            return OldLogProbs(*recorded(rollout, ar_steps, diffusion_steps))
        replayed = self._replay(rollout, ar_steps, diffusion_steps, mte_mask)
        return OldLogProbs(replayed.log_prob, replayed.mte_log_prob)

    def _replay(self, rollout: Rollout, ar_steps, diffusion_steps, mte_mask):
        """The policy's replay of the chosen steps under the run's autocast, the update's and log_prob_old's alike;
        the extra trajectories only where Eq. 10 uses them (the uncertainty mask)."""
        with self.engine.autocast():
            return replay(
                self.policy,
                rollout,
                ar_steps,
                diffusion_steps,
                logprob_cfg=self.cfg.logprob_cfg,
                with_mte=self.cfg.trajectories > 1,
                mte_tokens=mte_mask,
            )

    def choose_steps(self, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """|M| AR steps and, for each, |T| stochastic diffusion steps, uniformly (design.md §3.3)."""
        return choose_steps(
            self.ar_steps, stochastic_steps(self.sampling), self.cfg.mask_steps, self.cfg.diffusion_steps, g
        )

    def recorded_steps(self, ar: torch.Tensor) -> torch.Tensor:
        """The AR steps the rollout records in full: the chosen ones and, for Sim, each one's predecessor (kappa)."""
        return torch.cat([ar, ar - 1]).clamp(min=0).unique() if self.cfg.sim else ar

    def masks(self, rollout: Rollout) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """MTE's M^k and Sim's keep-weights per AR step (variants.variant_masks)."""
        return variant_masks(rollout, self.cfg.trajectories, self.cfg.top_frac, self.cfg.tau if self.cfg.sim else None)

    # --- what a step logs --------------------------------------------------------------------------------------------
    def step_row(self, batch: StepBatch, log: dict, seconds: float) -> dict:
        """The step's row of metrics.csv (run_files.step_row): rewards and advantages over every process's groups."""
        all_cat = self.engine.all_cat
        components = {k: all_cat(v) for k, v in batch.components.items()}
        frac_zero = all_cat(torch.tensor([batch.frac_zero], device=batch.adv.device)).mean().item()  # equal shares
        self.step += 1
        lr = self.optimizer.param_groups[0]["lr"]
        return step_row(self.step, all_cat(batch.rewards), components, all_cat(batch.adv), frac_zero, log, lr, seconds)

    # --- validation, checkpoints, resume (grpo.validation, grpo.checkpoints) ------------------------------------
    def validate(self) -> list[float]:
        """Each validation prompt's reward under the same noise every step (grpo.validation), the EMA's weights
        where they are on; the first images to the trackers."""
        step = self.step

        def log_images(images: torch.Tensor) -> None:
            log_image_grid(self.accelerator, "val/samples", images, step)

        return validation_rewards(
            self.policy,
            self.reward_fn,
            self.val_prompts,
            self.sampling,
            self.engine,
            prompts=self.cfg.val_prompts,
            images=self.cfg.val_images,
            ema=self.ema,
            log_images=log_images if self.accelerator.trackers else None,
        )

    def write_outputs(self, spec: dict) -> None:
        """metrics.csv (one row per step) and summary.json (checkpoints with validation rewards) in the run folder."""
        write_run_outputs(self.out_dir, self.run, spec["variant"]["name"], spec, self.settings())

    def save(self, background: bool = False) -> float:
        """Checkpoint (policy folder) + resumable training state (grpo.checkpoints); returns the longest save's
        seconds so far."""
        header = {"rows": self.rows, "checkpoints": self.checkpoints, "nonfinite_run": self.nonfinite_run}
        header = {**header, "spec_hash": self.spec_hash, "record": self.record}
        return self.checkpointer.save(self.step, header, background)

    def finish_saves(self, wait: bool = True) -> None:
        self.checkpointer.finish(wait)

    def try_resume(self, restart: bool = False) -> bool:
        """Resume from state/ where it was written under settings that give the same steps (`self.record`)."""
        legacy_hash = legacy_resume_key(self.settings(), asdict(self.sampling), self.spec)  # a format-1 state's key
        header = self.checkpointer.resume(self.record, legacy_hash, restart)
        if header is None:
            return False
        self.step, self.rows, self.checkpoints = header["step"], header["rows"], header["checkpoints"]
        self.nonfinite_run = header["nonfinite_run"]
        return True
