"""The default config's toy policies (config/config.yaml) at random init, and the rollout their ratio checks replay
(tests/test_toy_proportions.py, and tests/ratio_worker.py under other kernel paths)."""

from pathlib import Path

import torch
from helpers import PROMPTS

from margrpo.experiment.config import load_config
from margrpo.grpo.rollout import SamplingConfig, generate
from margrpo.policy import ToyMAR, ToyMARConfig
from margrpo.world import prompt_vocabulary

CONFIG = load_config(Path(__file__).resolve().parents[1] / "config/config.yaml")
TOYS = [name for name, spec in CONFIG["policies"].items() if spec["kind"] == "toy"]


def default_toy(name: str, seed: int = 0) -> ToyMAR:
    """The policy `margrpo pretrain` builds for `name`, at random init; the head's adaLN-zero layers get a
    little noise so that its output, and the log-probs, depend on every parameter."""
    spec = CONFIG["policies"][name]
    torch.manual_seed(seed)
    policy = ToyMAR(ToyMARConfig(head_type=spec["head"], vocab=prompt_vocabulary(), **spec["model"]))
    with torch.no_grad():
        for p in policy.head_parameters():
            p.add_(0.02 * torch.randn_like(p))
    return policy


def default_toy_rollout(name: str) -> tuple[ToyMAR, object]:
    """`default_toy(name)` and its rollout of two prompts x 2 images with 3 trajectories at two MTE steps (the ratio
    check's, also run under other kernel paths by tests/ratio_worker.py)."""
    policy = default_toy(name)
    sampling = SamplingConfig(**{**CONFIG["policies"][name]["sampling"], "diffusion_steps": 4})
    r = generate(
        policy,
        PROMPTS[:2],
        sampling,
        group_size=2,
        generator=torch.Generator().manual_seed(0),
        trajectories=3,
        mte_steps=torch.tensor([1, sampling.ar_steps - 2]),
        mte_generator=torch.Generator().manual_seed(1),
    )
    return policy, r
