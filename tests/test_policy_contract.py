"""The policy contract (tests/policy_contract.py) names what a broken policy breaks: a toy whose dropout follows
autograd instead of train mode (off in the no-grad rollout, on in the training replay) fails the ratio check alone.
The real policies opt in in their own test files (test_policy_rollout.py: the toy's two heads, test_policy_nova.py,
test_policy_harmon.py)."""

import torch
import torch.nn.functional as F
from helpers import tiny_policy
from policy_contract import PolicyContract

from margrpo.policy import ToyMAR

pytest_plugins = ["pytester"]
CHECKS = sorted(name for name in dir(PolicyContract) if name.startswith("test_"))


class GradModeDropout(ToyMAR):
    """A toy whose z takes dropout whenever autograd records, whatever the train mode says."""

    def ar_forward(self, tokens, known_mask, cond):
        z = super().ar_forward(tokens, known_mask, cond)
        return F.dropout(z, 0.2, training=torch.is_grad_enabled())


def grad_mode_dropout_toy() -> GradModeDropout:
    toy = tiny_policy("flow")
    broken = GradModeDropout(toy.config, toy.tokenizer)
    broken.load_state_dict(toy.state_dict())
    return broken


def test_a_toy_with_dropout_in_the_replay_fails_the_ratio_check_alone(pytester):
    pytester.makepyfile(
        test_broken="""
from policy_contract import PolicyContract
from test_policy_contract import GradModeDropout, grad_mode_dropout_toy


class TestBrokenContract(PolicyContract):
    build = staticmethod(grad_mode_dropout_toy)
    load = staticmethod(GradModeDropout.from_pretrained)  # load_policy reads a toy folder as a plain ToyMAR
"""
    )
    passed, skipped, failed = pytester.inline_run("-p", "no:cacheprovider").listoutcomes()
    assert [r.nodeid.rsplit("::", 1)[1] for r in failed] == ["test_ratio_is_one_on_unchanged_parameters"]
    assert sorted(r.nodeid.rsplit("::", 1)[1] for r in passed + failed) == CHECKS and not skipped
