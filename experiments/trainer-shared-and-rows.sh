#!/usr/bin/env bash
# One device call on 4 x H100 (`.whl` carried): the 2-GPU layout of configs/gpu-fsdp-shared.yaml (a replica
# beside each trainer rank) on GPUs 0-1, and trainer benchmark rows on GPUs 2-3, at the same time.
#   OUT=DIR bash experiments/trainer-shared-and-rows.sh
set -uo pipefail
root=${OUT:-runs/device-out}
mkdir -p "$root"
bash configs/device-setup.sh > /tmp/setup.log 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
(
  CUDA_VISIBLE_DEVICES=0,1 OUT=$root/shared CONFIG=configs/gpu-fsdp-shared.yaml RUN=runs/fsdp-shared \
    bash configs/gpu-fsdp.sh > "$root/shared.log" 2>&1
  nvidia-smi >> "$root/shared.log"
  (cd "$root" && tar czf shared.tgz shared && rm -rf shared)
) &
(
  export CUDA_VISIBLE_DEVICES=2,3
  ROWS="qwen1.5b-2gpu-32768-compile-noreshard qwen1.5b-2gpu-32768-compile qwen0.5b-1gpu-compile" \
    bash experiments/trainer.sh runs/rows > "$root/rows.log" 2>&1
  tar czf "$root/rows.tgz" runs/rows
) &
wait
ls -la "$root"
