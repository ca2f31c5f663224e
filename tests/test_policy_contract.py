"""The policy contract (tests/policy_contract.py) catches a broken policy by the check it breaks: a toy whose dropout
stays on in rollout and replay fails the ratio check alone. The real policies opt in in their own test files
(test_policy_rollout.py: the toy's two heads, test_policy_nova.py, test_policy_harmon.py)."""

from helpers import tiny_policy
from policy_contract import PolicyContract

from margrpo.policy import ToyMAR

pytest_plugins = ["pytester"]
CHECKS = sorted(name for name in dir(PolicyContract) if name.startswith("test_"))


class DropoutLeaks(ToyMAR):
    """A toy whose `train(False)` leaves dropout on: the rollout and its replay draw different dropout masks."""

    def train(self, mode: bool = True) -> "DropoutLeaks":
        super().train(mode)
        for m in self.modules():
            m.training = True
        return self


def leaky_toy() -> DropoutLeaks:
    toy = tiny_policy("flow", dropout=0.2)
    leaky = DropoutLeaks(toy.config, toy.tokenizer)
    leaky.load_state_dict(toy.state_dict())
    return leaky


def test_a_toy_whose_dropout_stays_on_fails_the_ratio_check_alone(pytester):
    pytester.makepyfile(
        test_leaky="""
from policy_contract import PolicyContract
from test_policy_contract import DropoutLeaks, leaky_toy


class TestLeakyContract(PolicyContract):
    build = staticmethod(leaky_toy)
    load = staticmethod(DropoutLeaks.from_pretrained)  # load_policy knows the toy's folder as ToyMAR's
"""
    )
    passed, skipped, failed = pytester.inline_run("-p", "no:cacheprovider").listoutcomes()
    assert [r.nodeid.rsplit("::", 1)[1] for r in failed] == ["test_ratio_is_one_on_unchanged_parameters"]
    assert sorted(r.nodeid.rsplit("::", 1)[1] for r in passed + failed) == CHECKS and not skipped
