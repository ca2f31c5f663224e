"""MAR-GRPO: stabilized GRPO for AR-diffusion hybrid image generators.

The packages, bottom to top; a module imports only from its own layer and the layers below, never
from one above (`tests/test_layout.py` checks it, imports inside functions and under TYPE_CHECKING included):

    0  infra                   plumbing: atomic files and manifests, runtime, launcher, strict readers
    1  world, diffusion        the toy world; the head's samplers with exact log-probabilities
    2  prompts, policy         prompt suites and files; the MAR policies (toy, NOVA, Harmon)
    3  rewards                 reward scorers behind one signature
    4  grpo                    MAR-GRPO: rollout, loss functions, the one trainer
    5  toylab, related         the toy lab's trained pieces; the related methods (maskgrpo, marval)
    6  evaluation, reporting   scores of sample folders; tables, figures and claims from result files
    7  experiment              the config, its checks against every part, stage specs, the settings record
    8  stages, plan, cli       the pipeline's stages, the memory plan, and the `margrpo` command
"""

__version__ = "0.1.0"
