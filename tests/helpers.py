"""Tiny random-weight policies, prompt sets, the tests' reward and trainer, shared by the tests."""

import dataclasses
import os
import signal
from pathlib import Path

import torch

from margrpo.grpo.rollout import SamplingConfig
from margrpo.grpo.step_hooks import StepHooks
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
from margrpo.policy import ToyMAR, ToyMARConfig
from margrpo.policy.settings import PolicySettings
from margrpo.prompts.suites import PromptSet

REPO = Path(__file__).resolve().parents[1]
VOCAB = "a an red blue green circle square triangle and on the left right of above below two three".split()
PROMPTS = ["a red circle", "a blue square", "two green triangles", "a red square on the left of a blue circle"]
SAMPLING = SamplingConfig(ar_steps=4, diffusion_steps=5, cfg_scale=2.0)
PROMPT_SET = PromptSet(PROMPTS, [{}] * len(PROMPTS))
TINY_TOYCLIP = dict(width=8, embed_dim=8, text_width=8, text_depth=1, text_heads=2)


def tiny_policy(head: str = "flow", seed: int = 0, dropout: float = 0.0, **overrides) -> ToyMAR:
    torch.manual_seed(seed)
    cfg = dict(
        head_type=head,
        vocab=VOCAB,
        width=32,
        depth=2,
        heads=4,
        head_width=32,
        head_depth=2,
        text_width=16,
        text_depth=1,
        text_heads=2,
        dropout=dropout,
    )
    cfg.update(overrides)
    policy = ToyMAR(ToyMARConfig(**cfg))
    with torch.no_grad():  # the head starts as zero (adaLN-zero): give it a non-trivial output
        for p in policy.diffloss.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return policy


def tiny_toyclip(seed: int = 0):
    """A tiny random toyclip scorer of the default world's vocabulary, in eval mode."""
    from margrpo.rewards.toyclip import ToyClip, ToyClipConfig
    from margrpo.toylab.toyclip_training import default_vocabulary
    from margrpo.world import WorldConfig

    torch.manual_seed(seed)
    return ToyClip(ToyClipConfig(vocab=default_vocabulary(WorldConfig()), **TINY_TOYCLIP)).eval()


def redness(images, prompts, metadata, against: int = 2):
    """The tests' reward: each image's mean red minus its mean of channel `against` (2, blue; the toy-mask tests
    subtract 1, green), [B]."""
    r = images[:, 0].mean((1, 2)) - images[:, against].mean((1, 2))  # [B]
    return r, {"redness": r}


def make_trainer(tmp_path, policy=None, device=None, hooks=None, sampling=SAMPLING, **kw):
    """A tiny trainer rewarded by `redness`; `kw` sets GRPOConfig's fields and the policy's settings (PolicySettings)
    alike, over 2 steps at lr 1e-3 unless it names others; `hooks`: the step's (grpo.step_hooks, e.g. `KillAt`)."""
    policy_keys = {f.name for f in dataclasses.fields(PolicySettings)}
    settings = PolicySettings(**{k: kw.pop(k) for k in list(kw) if k in policy_keys})
    cfg = dict(
        steps=2,
        batch_prompts=2,
        group_size=2,
        mask_steps=3,
        diffusion_steps=3,
        save_every=1,
        val_every=1,
        val_prompts=2,
        precision="no",
        lr=1e-3,
    )
    cfg.update(kw)
    cfg.setdefault("grad_variance", cfg.get("micro_batches", 2) > 1)  # the probe, where there is a variance to take
    return GRPOTrainer(
        policy or tiny_policy("flow"),
        redness,
        PROMPT_SET,
        PROMPT_SET,
        sampling,
        GRPOConfig(**cfg),
        tmp_path,
        device=device,
        policy_settings=settings,
        hooks=hooks,
    )


class KillAt(StepHooks):
    """A fresh run killed as its step `step` + 1 begins, after step `step` was logged, validated and saved: `kill`
    (default: the test's failure, which stands for the job's death)."""

    def __init__(self, step: int, kill=None):
        self.step, self.begun = step, 0
        self.kill = kill or (lambda: __import__("pytest").fail("killed"))

    def rolling_out(self) -> None:
        if self.begun == self.step:
            self.kill()
        self.begun += 1


class StopAt(StepHooks):
    """A stop request inside step `step` + 1 of a fresh run: `send` (default: SIGTERM to this process, as SLURM sends
    it) as its AR step `ar_step` begins, or as the backward pass `part` of its update `update` (0: the first; 1: the
    second, after the first optimizer step) is about to run. `after` lists what the step still showed the hooks
    after the request: ("ar", k) for an AR step begun, ("part", update, i) for a backward pass."""

    def __init__(self, step: int, ar_step: int | None = None, update: int | None = None, part: int = 0, send=None):
        self.step, self.at_ar_step, self.at_update, self.at_part = step, ar_step, update, part
        self.send = send or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.begun, self.updates, self.sent, self.after = 0, 0, False, []

    def rolling_out(self) -> None:
        self.begun, self.updates = self.begun + 1, 0

    def _now(self, what: tuple, at: bool) -> None:
        if self.sent:
            self.after.append(what)
        elif at and self.begun == self.step + 1:
            self.sent = True
            self.send()

    def ar_step(self, k: int) -> None:
        self._now(("ar", k), k == self.at_ar_step)

    def replays(self, passes):
        update, self.updates = self.updates, self.updates + 1
        for i, part in enumerate(passes):
            self._now(("part", update, i), update == self.at_update and i == self.at_part)
            yield part


def random_batches(n, generator):
    """Random images and prompts, drawn from the training generator (so a resume draws the same)."""
    return torch.rand(n, 3, 64, 64, generator=generator), [PROMPTS[i % len(PROMPTS)] for i in range(n)]


def pretrain(state_dir, steps=4, policy=None, **kw):
    """Pre-train a tiny policy on `random_batches` into `state_dir` (saving every 2 steps), logging to its log.csv."""
    from margrpo.toylab.pretraining import PretrainConfig, train

    cfg = PretrainConfig(steps=steps, batch_size=2, warmup_steps=1, save_every=2, precision="no", **kw)
    return train(
        policy or tiny_policy("flow", seed=3), random_batches, cfg, state_dir, log_path=Path(state_dir) / "log.csv"
    )


def train_inputs(tmp_path) -> dict:
    """A tiny policy folder and train / val suites in `tmp_path`; the smoke config's `margrpo train` spec, rewarded by
    `shapes` (no reward model to train)."""
    from margrpo.experiment.config import load_config, train_spec
    from margrpo.prompts.suites import PromptRecord, write_suite

    tiny_policy("flow", seed=1).save_pretrained(tmp_path / "policy")
    objects = [
        {"color": c, "shape": s, "texture": None, "count": 1} for c, s in (("red", "circle"), ("blue", "square"))
    ]
    records = [
        PromptRecord(f"a {o['color']} {o['shape']}", "color", {"objects": [o], "relation": None, "exact_count": False})
        for o in objects
    ]
    for split in ("train", "val"):
        write_suite(records, tmp_path / "suites" / f"{split}.jsonl")
    spec = train_spec(load_config(REPO / "config/smoke.yaml"), "toy-nova", "toyclip", "grpo")
    return {**spec, "reward": {"name": "shapes", "weights": {"shapes": 1.0}}}


def flip_last_byte(path) -> None:
    """Change one bit of a file, as a bit flip on disk would: loads silently unless a checksum catches it."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def replayed_ratios(policy, r):
    """Replay every (AR step, diffusion step) that rollout `r` recorded in full (all, unless generated with
    `full_steps`):
    (the replay, the PPO ratios of the committed trajectory's replayed tokens, those of every extra trajectory of every
    token predicted at an MTE step, or None without MTE)."""
    from margrpo.grpo.replay import recorded, replay
    from margrpo.grpo.rollout import stochastic_steps

    T = stochastic_steps(r.sampling)
    ar = r.full_steps().nonzero().flatten()
    diff = torch.arange(T)[None].repeat(len(ar), 1)
    rp = replay(policy, r, ar, diff, with_mte=r.trajectories > 1)
    old, old_mte = recorded(r, ar, diff)
    assert rp.mask.sum() > 0
    ratio, mte_ratio = torch.exp(rp.log_prob - old)[rp.mask], None
    if r.trajectories > 1:
        has = (~r.known[ar]) & (r.mte_slots()[ar] >= 0)[:, None, None]  # [K, N, L]
        replayed = has[:, None, None].expand_as(rp.mte_log_prob)
        assert replayed.any()
        mte_ratio = torch.exp(rp.mte_log_prob - old_mte)[replayed]
    return rp, ratio, mte_ratio


def assert_ratio_is_one(policy, r, atol=1e-5):
    """design.md §3.2: replaying every (AR step, diffusion step) of rollout `r` with unchanged parameters
    reproduces the recorded log-probs — committed trajectory and MTE trajectories alike."""
    rp, ratio, mte_ratio = replayed_ratios(policy, r)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=atol, rtol=0), (ratio.min(), ratio.max())
    if mte_ratio is not None:
        assert torch.allclose(mte_ratio, torch.ones_like(mte_ratio), atol=atol, rtol=0), (
            mte_ratio.min(),
            mte_ratio.max(),
        )
    return rp


# Issue #36: a user's files in a run folder, none of which a run may remove (fresh start, resume or restart).
USER_FILES = {
    "notes.txt": b"the run folder's top\n",
    "state/notes.txt": b"state/, no trainer state there yet\n",
    "state/mine/deep/data.bin": bytes(range(256)),  # a nested folder
    "state/.trainer.pt.bak": b"a dot file named like the trainer's temporary files\n",
    "state/ckpt-000001/notes.txt": b"beside a checkpoint the run writes\n",
    "state/ckpt-000005/policy/notes.txt": b"a folder with a checkpoint's name that no run wrote\n",
    "tb/grpo/notes.txt": b"in the trackers' folder, which a fresh start clears of its event files\n",
}


def plant_user_files(run) -> None:
    for name, data in USER_FILES.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_bytes(data)


def assert_user_files_kept(run, when: str) -> None:
    """Every planted file still there, byte for byte."""
    found = {name: (run / name).read_bytes() if (run / name).is_file() else None for name in USER_FILES}
    assert found == USER_FILES, f"{when}: lost or changed {sorted(k for k in USER_FILES if found[k] != USER_FILES[k])}"
