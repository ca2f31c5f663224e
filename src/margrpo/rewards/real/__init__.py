"""Real-scale reward models and metrics (design.md §5), every one loaded from local files.

Nothing is downloaded: each scorer takes the local path(s) of its weights as keyword options
(config `reward_models.<name>`), and a missing path raises FileNotFoundError naming the files
expected there and where to get them. Each model is built once in the constructor; `__call__`
batches internally (`batch_size=`) under `torch.no_grad()` on the `device=` option (default
"cpu"); images are quantised to 8-bit RGB and go through each model's reference preprocessing
(its Hugging Face processor or its package's transform), as a saved PNG would.

Each scorer by name, its model, and its score per image:

- `pickscore`: PickScore_v1 (transformers CLIPModel); exp(logit_scale) * cos(img, txt), raw (about 18-24).
- `clipscore`: CLIP (transformers CLIPModel); `form="cosine"`: cos(img, txt) (T2I-CompBench),
  `"clipscore_100"`: 100 * max(cos, 0).
- `aesthetic`: CLIP ViT-L/14 image embedding, L2-normalised, -> LAION improved-aesthetic MLP; MLP output
  (about 1-10).
- `vqa`: BLIP-VQA (transformers BlipForQuestionAnswering); prod over noun phrases of P(yes | "{phrase}?")
  (T2I-CompBench).
- `git_vqa`: GIT (transformers GitForCausalLM, e.g. git-large-vqav2); mean over noun phrases of
  P(yes | "{phrase}?") (T2I-R1).
- `grounding_dino`: Grounding DINO (transformers AutoModelForZeroShotObjectDetection); T2I-R1 detection
  reward: relation / count / presence.
- `hpsv2`: HPS v2.1 (hpsv2's open_clip ViT-H-14); cos(img, txt) (hpsv2's `score`).
- `imagereward`: ImageReward-v1.0 (image-reward package); (MLP(BLIP cross-attended [CLS]) - mean) / std.

P(yes) is p_yes / (p_yes + p_no) of the answer's first token, as T2I-CompBench (BLIP) and T2I-R1
(GIT) compute it. hpsv2 and imagereward need packages that live only in the evaluator
environment (`.venv-eval`, `make evaluators`); their imports happen in the constructor.

Prompt analysis (noun phrases, spatial relations, object counts) is rule-based and lives in
`margrpo.prompts.analysis`; where a prompt's metadata carries the T2I-R1 fields (`task_type`,
`nouns`, `attr_nouns`, `spatial_info`, `numeracy_info`, as in
`src/margrpo/data/mar-grpo/train_prompts.jsonl`), those are used instead of the rules.

One module per family: `clip`, `vqa`, `detection`, `evaluator_stack` (shared file and batch
helpers in `_common`). Each scorer class is registered where it is defined (`@register_reward`),
so importing this package registers them all; the model packages are imported in the constructors.
Layer 3 (see margrpo/__init__.py): it must not import grpo, toylab, related, evaluation, reporting, experiment,
stages, cli.
"""

from margrpo.prompts.analysis import (
    DetectionTask,
    Relation,
    detection_task,
    noun_phrases,
    object_name,
    parse_counts,
    parse_relation,
    singular,
    vqa_phrases,
)
from margrpo.rewards.real.clip import AestheticMLP, AestheticReward, ClipScoreReward, PickScoreReward
from margrpo.rewards.real.detection import (
    Detections,
    GroundingDinoReward,
    box_iou,
    count_boxes,
    count_match_score,
    nms,
    relation_score,
    t2i_r1_numeracy_score,
    t2i_r1_presence_score,
    t2i_r1_spatial_score,
)
from margrpo.rewards.real.evaluator_stack import HPSv2Reward, ImageRewardReward
from margrpo.rewards.real.vqa import BlipVQAReward, GitVQAReward

__all__ = [
    "AestheticMLP",
    "AestheticReward",
    "BlipVQAReward",
    "ClipScoreReward",
    "Detections",
    "DetectionTask",
    "GitVQAReward",
    "GroundingDinoReward",
    "HPSv2Reward",
    "ImageRewardReward",
    "PickScoreReward",
    "Relation",
    "box_iou",
    "count_boxes",
    "count_match_score",
    "detection_task",
    "nms",
    "noun_phrases",
    "object_name",
    "parse_counts",
    "parse_relation",
    "relation_score",
    "singular",
    "t2i_r1_numeracy_score",
    "t2i_r1_presence_score",
    "t2i_r1_spatial_score",
    "vqa_phrases",
]
