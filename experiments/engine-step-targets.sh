#!/usr/bin/env bash
# The decode targets as `laminar bench engine` measures them, on one GPU: the CUDA checks, then the README's two
# curves (Qwen2.5-0.5B at batches 1-256, Qwen2.5-7B at 1-64), then the two target rows twice more (the spread).
#   OUT=DIR bash experiments/engine-step-targets.sh      (through the device tool; nothing carried)
set -uo pipefail
out=${OUT:-runs/engine-targets}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv
python3 -m laminar.cuda_check 2>&1 | grep -v "Warning\|warn(" | tee "$out/cuda_check.log"
bench() {  # bench LABEL MODEL BATCHES...
  local label=$1 model=$2; shift 2
  python3 -m laminar.cli bench engine --device cuda --model "$model" --batch-sizes "$@" --hf-batch-sizes \
    --new-tokens 512 --out "$out/$label" 2>&1 | grep -v "USDT\|Warning\|warn(" | tee "$out/$label.log"
}
bench curve-0.5b qwen2.5-0.5b 1 64 128 256
bench curve-7b qwen2.5-7b 1 32 64
for run in 2 3; do
  bench run$run-0.5b qwen2.5-0.5b 128
  bench run$run-7b qwen2.5-7b 64
done
bench profile-0.5b qwen2.5-0.5b 128 --profile 128   # inside the 0.5B step: kernels, graph alone, the host's share
