#!/usr/bin/env bash
# The trainer benchmark of results/trainer (GPU machine; 4 x H100 for the numbers committed):
#   bash experiments/trainer.sh OUT_DIR
#   ROWS="qwen0.5b-1gpu-compile qwen1.5b-2gpu-32768-compile" bash experiments/trainer.sh OUT_DIR   (some rows)
# The schedule benchmark's length distribution (configs/gpu-schedules.yaml: response median 256, p99 10x,
# capped at 2048; 8 groups of 8 a step), random-initialised models of each shape.
set -u
OUT=${1:-results/trainer}
DIST="--groups 8 --group-size 8 --prompt 32 --response-median 256 --response-p99-ratio 10 --response-max 2048 --steps 4"
bench() {
  name=$1; shift
  [ -z "${ROWS:-}" ] || [[ " $ROWS " == *" $name "* ]] || return 0
  echo "== $name: $*"; python3 -m laminar.cli bench trainer $DIST --out "$OUT/$name" "$@" 2>&1 | grep -v "Warning\|warn(" | tail -34
}
bench qwen0.5b-1gpu-padded --shape qwen2.5-0.5b --ranks 1 --micro-batch-tokens 32768 --packing off
bench qwen0.5b-1gpu --shape qwen2.5-0.5b --ranks 1 --micro-batch-tokens 16384 --profile
bench qwen0.5b-1gpu-32k --shape qwen2.5-0.5b --ranks 1 --micro-batch-tokens 32768
bench qwen0.5b-2gpu --shape qwen2.5-0.5b --ranks 2 --micro-batch-tokens 16384
bench qwen1.5b-2gpu --shape qwen2.5-1.5b --ranks 2 --micro-batch-tokens 16384
bench qwen1.5b-2gpu-compile --shape qwen2.5-1.5b --ranks 2 --micro-batch-tokens 16384 --compile
bench qwen0.5b-1gpu-compile --shape qwen2.5-0.5b --ranks 1 --micro-batch-tokens 16384 --compile
bench qwen0.5b-1gpu-32768-compile --shape qwen2.5-0.5b --ranks 1 --micro-batch-tokens 32768 --compile
bench qwen1.5b-2gpu-noreshard --shape qwen2.5-1.5b --ranks 2 --micro-batch-tokens 16384 --no-reshard
bench qwen1.5b-2gpu-32768-noreshard --shape qwen2.5-1.5b --ranks 2 --micro-batch-tokens 32768 --no-reshard
bench qwen1.5b-2gpu-32768-compile --shape qwen2.5-1.5b --ranks 2 --micro-batch-tokens 32768 --compile
bench qwen7b-2gpu --shape qwen2.5-7b --ranks 2 --micro-batch-tokens 16384 --activation-checkpointing
bench qwen1.5b-2gpu-32768-compile-noreshard --shape qwen2.5-1.5b --ranks 2 --micro-batch-tokens 32768 --compile --no-reshard --steps 8
