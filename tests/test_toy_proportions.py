"""The toy in the real models' proportions (design.md §4): the default config's toy heads are light, the
design.md §3 invariants hold on those toys themselves (not only on the tests' tiny one), and
benchmarks/policy_cost.py reports the shares beside NOVA's and Harmon's."""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from default_toys import CONFIG, TOYS, default_toy, default_toy_rollout
from helpers import PROMPTS, assert_ratio_is_one, make_trainer

from margrpo.grpo.rollout import SamplingConfig, generate
from margrpo.grpo.variants import LossInputs
from margrpo.policy import ToyMAR

ROOT = Path(__file__).resolve().parents[1]


def head_share(policy: ToyMAR) -> float:
    head = sum(p.numel() for p in policy.head_parameters())
    non_text = sum(p.numel() for n, p in policy.named_parameters() if not n.startswith("text_encoder."))
    assert (
        head + sum(p.numel() for p in policy.ar_parameters()) == non_text
    )  # AR and head split the non-text parameters
    return head / non_text


# The bases that stand in for NOVA and Harmon hold their heads to the real models' proportions (a few percent);
# toy-micro, the climbing ladder's base (a gradient with a direction, not a stand-in), is shrunk everywhere but its
# head's floor and holds 15.6%: it is held to 20%
HEAD_SHARE_BOUND = {name: 0.20 if name == "toy-micro" else 0.15 for name in TOYS}


@pytest.mark.parametrize("name", TOYS)
def test_default_toy_head_holds_at_most_15_percent_of_the_non_text_parameters(name):
    assert head_share(default_toy(name)) <= HEAD_SHARE_BOUND[name]


@pytest.mark.parametrize("name", TOYS)
def test_default_toy_replays_committed_and_mte_trajectories_with_ratio_one(name):
    assert_ratio_is_one(*default_toy_rollout(name))


def test_default_toy_reductions_give_the_plain_loss(tmp_path):
    """S = 1 / k = 0 / tau = -inf reduce the MTE and Sim losses to the plain loss on the default toy-nova."""
    policy = default_toy(TOYS[0])
    sampling = SamplingConfig(**{**CONFIG["policies"][TOYS[0]]["sampling"], "diffusion_steps": 4})
    r = generate(
        policy,
        PROMPTS[:2],
        sampling,
        group_size=2,
        generator=torch.Generator().manual_seed(3),
        trajectories=3,
        mte_generator=torch.Generator().manual_seed(4),
    )
    ar, diff = torch.tensor([0, 3, 6]), torch.tensor([[0, 1], [1, 2], [0, 2]])
    adv = torch.tensor([0.5, -0.5, 1.0, -1.0])
    base, _ = make_trainer(tmp_path / "a", policy=policy, beta=0.0).micro_loss(LossInputs(r, adv, ar, diff))
    one, _ = make_trainer(tmp_path / "s", policy=policy, beta=0.0, trajectories=1).micro_loss(
        LossInputs(r, adv, ar, diff)
    )
    k0 = make_trainer(tmp_path / "b", policy=policy, beta=0.0, trajectories=3, top_frac=0.0)
    mte_mask, _ = k0.masks(r)
    loss_k0, _ = k0.micro_loss(LossInputs(r, adv, ar, diff, mte_mask))
    sim = make_trainer(tmp_path / "c", policy=policy, beta=0.0, sim=True, tau=-math.inf)
    _, keep = sim.masks(r)
    loss_tau, _ = sim.micro_loss(LossInputs(r, adv, ar, diff, sim_keep=keep))
    assert not mte_mask.any() and keep.all()
    assert torch.equal(base, one) and torch.equal(base, loss_k0) and torch.equal(base, loss_tau)


def test_policy_cost_test_mode_prints_each_head_share():
    out = subprocess.run(
        [sys.executable, "benchmarks/policy_cost.py", "--test"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    shares = {
        m[1]: float(m[2])
        for m in re.finditer(r"^\s*(\S+): head .*?AR \+ head parameters \(([\d.]+)%\)", out.stdout, re.M)
    }
    assert set(shares) == {*TOYS, "NOVA-0.6B", "Harmon-1.5B"}, out.stdout
    assert all(shares[name] <= 100 * HEAD_SHARE_BOUND[name] for name in TOYS)
    # design.md §4: the 3 x 1280 diffusion MLP of nova-d48w1024
    assert shares["NOVA-0.6B"] == pytest.approx(5.1, abs=0.1)
    for name in shares:  # every policy: its share of a rollout's and of a step's FLOPs, and the MTE/Fix FLOP ratio
        line = next(ln for ln in out.stdout.splitlines() if ln.strip().startswith(f"{name}:"))
        assert re.search(
            r"rollout's FLOPs [\d.]+%, of a \+Fix step's [\d.]+%; MTE/Fix FLOPs \(S=4, k=0.3\) ([\d.]+); per image",
            line,
        ), line
