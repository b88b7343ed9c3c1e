#!/usr/bin/env bash
# The embedded task's learning run on one GPU with the trainer's decoder layers compiled (`trainer.compile=true`,
# which takes effect on CUDA only), then the same run eager: rewards over steps for both (results/compile-curve).
# Carries the slim wheel set (`bash configs/slim-wheels.sh`): carry [".carry/wheels"], OUT set by the device tool.
#   WHEELS=.carry/wheels bash configs/gpu-compile-curve.sh [OVERRIDES...]
# A fresh machine compiles each replica's kernels at its first start: give it time (rollout.start_timeout_s).
set -uo pipefail
out=${OUT:-runs/compile-curve}; mkdir -p "$out"
bash configs/device-setup.sh
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for compile in true false; do
  python3 -m laminar.cli train --out "$out/compile-$compile" trainer.compile=$compile trainer.num_gpus=0.5 \
    rollout.num_gpus=0.25 "$@" 2>&1 | grep -v "Warning\|warn(" > "$out/compile-$compile.log"
  echo "compile=$compile: rc $?"; grep "^step" "$out/compile-$compile.log" | sed -n '1p;40p;80p;120p;$p'
  tail -25 "$out/compile-$compile.log" | grep -v "^step"
  rm -rf "$out/compile-$compile/checkpoint"* "$out/compile-$compile/trajectories.jsonl"
done
