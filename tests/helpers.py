"""Tiny random-weight policies and prompt sets shared by the tests."""

import torch

from margrpo.policy import ToyMAR, ToyMARConfig

VOCAB = "a an red blue green circle square triangle and on the left right of above below two three".split()
PROMPTS = ["a red circle", "a blue square", "two green triangles", "a red square on the left of a blue circle"]


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
    """DESIGN 3.2: replaying every (AR step, diffusion step) of rollout `r` with unchanged parameters
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
