#!/usr/bin/env bash
# One device call on 4 x H100 (`.whl`, the GGUF's last part and its checksum carried; see
# configs/gpu-smollm2-tool.sh for the parts before): trainer benchmark rows on GPUs 2-3 (the publish stall of
# the 1.5B shape) while SmolLM2 is imported and warm-started on GPU 0; once the rows end, SmolLM2's GRPO run on
# `tool_arith` on GPUs 0-1.
#   OUT=DIR bash experiments/tools-gpu.sh [OVERRIDES of the GRPO run...]
set -uo pipefail
root=${OUT:-runs/device-out}
mkdir -p "$root"
bash configs/device-setup.sh > /tmp/setup.log 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
rm -f /tmp/rows-done
(
  export CUDA_VISIBLE_DEVICES=2,3
  ROWS="${ROWS:-qwen1.5b-2gpu-32768-noreshard qwen1.5b-2gpu-32768-compile-noreshard}" \
    bash experiments/trainer.sh runs/rows > "$root/rows.log" 2>&1
  tar czf "$root/rows.tgz" runs/rows
  touch /tmp/rows-done
) &
(
  CUDA_VISIBLE_DEVICES=0,1 OUT=$root/smollm2 WAIT_FOR=/tmp/rows-done bash configs/gpu-smollm2-tool.sh "$@" \
    > "$root/smollm2.log" 2>&1
  (cd "$root" && tar czf smollm2.tgz smollm2 && rm -rf smollm2)
) &
wait
ls -la "$root"
