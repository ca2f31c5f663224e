#!/usr/bin/env bash
# The real-scale evaluator stack (hpsv2, image-reward, t2v-metrics) in its own venv, .venv-eval.
# These packages pin old versions of pytest, protobuf, timm and torch; installing them with
# --no-deps on top of the core pins (constraints.txt) keeps those pins from touching the core
# stack. Facts behind each step: docs/dependencies.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-eval
PIP="$VENV/bin/pip"
python3 -m venv "$VENV"
"$PIP" install --quiet torch==2.13.0
"$PIP" install --quiet -c constraints.txt -e .
# runtime needs of the three packages, resolved under the core constraints
"$PIP" install --quiet -c constraints.txt ftfy regex clint fairscale==0.4.13 datasets clip-anytorch==2.6.0 \
    opencv-python-headless omegaconf iopath openai tiktoken decord sentencepiece open-clip-torch
"$PIP" install --quiet --no-deps hpsv2==1.2.0 image-reward==1.5 t2v-metrics==1.2
# hpsv2 ships without its BPE vocabulary; clip-anytorch has the byte-identical file
site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [ ! -f "$site/hpsv2/src/open_clip/bpe_simple_vocab_16e6.txt.gz" ]; then
  cp "$site/clip/bpe_simple_vocab_16e6.txt.gz" "$site/hpsv2/src/open_clip/"
fi
HF_HUB_OFFLINE=1 "$VENV/bin/python" - <<'PY'
from margrpo.infra.compat import ensure_torchvision_importable

ensure_torchvision_importable()  # CPU torch + the CUDA-only torchvision build
import hpsv2, ImageReward, t2v_metrics  # noqa: F401,E401  (imports are the check)
print("evaluator stack imports: hpsv2, ImageReward, t2v_metrics")
PY
