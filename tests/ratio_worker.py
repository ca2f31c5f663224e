"""Run by test_ratio_kernels.py in a fresh process, whose environment picks the kernels (ATEN_CPU_CAPABILITY,
MKL_CBWR and the thread count are read at start-up): the default toys' rollout of
test_toy_proportions.py replayed at every (AR step, diffusion step), committed and MTE trajectories.
Prints one JSON line: the kernel capability torch runs with and, per toy, max |ratio - 1| of each.

    python tests/ratio_worker.py [THREADS]   (default 1, as the tests run)
"""

import json
import sys
from pathlib import Path

import torch

from margrpo.experiment.config import load_config
from margrpo.grpo.rollout import SamplingConfig, generate, recorded, replay, stochastic_steps
from margrpo.policy import ToyMAR, ToyMARConfig
from margrpo.world import prompt_vocabulary

PROMPTS = ["a red circle", "a blue square"]
CONFIG = load_config(Path(__file__).resolve().parents[1] / "config/config.yaml")


def deviation(name: str) -> tuple[float, float]:
    spec = CONFIG["policies"][name]
    torch.manual_seed(0)  # test_toy_proportions.default_toy
    policy = ToyMAR(ToyMARConfig(head_type=spec["head"], vocab=prompt_vocabulary(), **spec["model"]))
    with torch.no_grad():
        for p in policy.head_parameters():
            p.add_(0.02 * torch.randn_like(p))
    sampling = SamplingConfig(**{**spec["sampling"], "diffusion_steps": 4})
    r = generate(policy, PROMPTS, sampling, group_size=2, generator=torch.Generator().manual_seed(0), trajectories=3,
                 mte_steps=torch.tensor([1, sampling.ar_steps - 2]), mte_generator=torch.Generator().manual_seed(1))
    K, T = sampling.ar_steps, stochastic_steps(sampling)
    ar, diff = torch.arange(K), torch.arange(T)[None].repeat(K, 1)
    with torch.no_grad():
        rp = replay(policy, r, ar, diff, with_mte=True)
    old, old_mte = recorded(r, ar, diff)
    has = ((~r.known[ar]) & (r.mte_slots()[ar] >= 0)[:, None, None])[:, None, None].expand_as(rp.mte_log_prob)
    worst = lambda new, old, mask: float(torch.exp(new - old)[mask].sub(1).abs().max())  # noqa: E731
    return worst(rp.log_prob, old, rp.mask), worst(rp.mte_log_prob, old_mte, has)


if __name__ == "__main__":
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    toys = [name for name, spec in CONFIG["policies"].items() if spec["kind"] == "toy"]
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
                      **{name: deviation(name) for name in toys}}))
