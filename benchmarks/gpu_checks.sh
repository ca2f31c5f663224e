#!/usr/bin/env bash
# The real-scale checks that are still unmeasured (docs/real-scale.md, "On a GPU"), in one call that fits a
# short GPU loan. Each check is one `benchmarks/real_scale.py` run (random full-size weights) under its own
# time limit; each row is saved as it finishes, so a check cut off by its limit keeps the rows it has.
#
#   bash benchmarks/gpu_checks.sh OUT_DIR [SECONDS_PER_CHECK]     (default 240 s a check)
#
#   CHECKS="a b"  which checks, in order (default: the open ones, per-gpu-nova per-gpu-harmon):
#                per-gpu-nova    the official per-GPU batch (1 prompt x 4 images, as each of the paper's 3 GPUs
#                                holds it, weights whole), NOVA-0.6B GRPO and +Fix, replay_chunk 1 (the paper config)
#                per-gpu-harmon  the same for Harmon-1.5B with gradient checkpointing (its paper config)
#                nova-chunk1 harmon-chunk1 nova-chunk1-ckpt harmon-chunk1-ckpt
#                                the paper's whole batch (3 x 4 images) on one GPU, without / with checkpointing
#   WHEELS=DIR   first install DIR/*.whl (--no-index --no-deps) into $SITE (default /tmp/margrpo-site):
#                for a GPU machine without network whose Python lacks transformers, diffusers, peft, ...
#                (on the lent H200 image, 2026-11-28: transformers 4.55.4, diffusers 0.39.0, tokenizers 0.21.4,
#                huggingface-hub 0.36.2, jsonschema 4.26.0 with jsonschema-specifications, referencing, rpds-py)
#   TINY=1       the tests' tiny policies on the CPU: checks this script itself in seconds
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_checks.sh OUT_DIR [SECONDS_PER_CHECK]}
limit=${2:-240}
cd "$(dirname "$0")/.."
mkdir -p "$out"
if [ -n "${WHEELS:-}" ]; then
  site=${SITE:-/tmp/margrpo-site}
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
device=(--device cuda)
if [ -n "${TINY:-}" ]; then
  device=(--tiny --device cpu)
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.csv"
fi

check() {  # NAME ARGS...: one real_scale run, its log and JSON rows under OUT_DIR, its exit code in summary.txt
  local name=$1
  shift
  timeout "$limit" "$python" benchmarks/real_scale.py "${device[@]}" --steps 1 --out "$out/$name.json" "$@" 2>&1 |
    tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name: exit $rc$([ "$rc" = 124 ] && echo ", cut off at $limit s")" | tee -a "$out/summary.txt"
}

for name in ${CHECKS:-per-gpu-nova per-gpu-harmon}; do
  case $name in
    per-gpu-nova) check "$name" --policies nova --variants grpo,fix --per-gpu ;;
    per-gpu-harmon) check "$name" --policies harmon --variants fix,grpo --per-gpu --gradient-checkpointing ;;
    nova-chunk1) check "$name" --policies nova --variants fix,grpo --replay-chunk 1 ;;
    harmon-chunk1) check "$name" --policies harmon --variants fix,grpo --replay-chunk 1 ;;
    nova-chunk1-ckpt) check "$name" --policies nova --variants fix --replay-chunk 1 --gradient-checkpointing ;;
    harmon-chunk1-ckpt) check "$name" --policies harmon --variants fix --replay-chunk 1 --gradient-checkpointing ;;
    *) echo "unknown check $name" >&2; exit 2 ;;
  esac
done
