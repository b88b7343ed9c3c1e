#!/usr/bin/env bash
# Where a decode step's time goes, on one GPU, with the engine's pipelining off and on: `laminar bench engine`
# for the Qwen2.5-0.5B shape at batch 128 and the Qwen2.5-7B shape at batch 64 (the decode targets' rows), each
# step looked inside halfway through (`--profile`): the step as the engine runs it, its CUDA graph replayed
# alone, and its kernels by name. The CUDA checks run first.
#   OUT=DIR bash experiments/engine-step.sh      (through the device tool; nothing carried)
set -uo pipefail
out=${OUT:-runs/engine-step}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv
python3 -m laminar.cuda_check 2>&1 | tee "$out/cuda_check.log"
bench() {  # bench LABEL [FLAGS]
  local label=$1; shift
  python3 -m laminar.cli bench engine --device cuda --model qwen2.5-0.5b --batch-sizes 128 --hf-batch-sizes \
    --new-tokens 512 --profile 128 --out "$out/$label-0.5b" "$@" 2>&1 | grep -v USDT | tee "$out/$label-0.5b.log"
  python3 -m laminar.cli bench engine --device cuda --model qwen2.5-7b --batch-sizes 64 --hf-batch-sizes \
    --new-tokens 512 --profile 64 --out "$out/$label-7b" "$@" 2>&1 | grep -v USDT | tee "$out/$label-7b.log"
}
bench step-by-step --step-by-step
bench pipelined
