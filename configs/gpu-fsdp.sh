#!/usr/bin/env bash
# The device run behind results/trainer/fsdp-run (4 GPUs; `.whl` carried, made by
# `bash ../shared/device/fetch-ray-wheels.sh .whl`): install Ray, write the random Qwen2.5-1.5B-shaped model,
# train configs/gpu-fsdp.yaml, pack the run folder (without checkpoints) into $OUT.
#   bash configs/gpu-fsdp.sh [OVERRIDES...]
#   CONFIG=configs/gpu-fsdp-shared.yaml RUN=runs/fsdp-shared bash configs/gpu-fsdp.sh   (2 GPUs, shared)
set -uo pipefail
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-runs/device-out}
config=${CONFIG:-configs/gpu-fsdp.yaml}
run=${RUN:-runs/fsdp-run}
mkdir -p "$out"
bash configs/device-setup.sh > /tmp/setup.log 2>&1 || exit 1  # only what the image lacks
export PYTHONPATH=/tmp/site:$PWD
model=runs/models/qwen1.5b-random
[ -f $model/model.safetensors ] || python3 -m laminar.bench.random_model --shape qwen2.5-1.5b --out $model
date
python3 -m laminar.cli train "$config" run.out="$run" "$@" 2>&1 | tee "$out/train.log" | grep -v "Warning\|warn"
rc=$?
date
tar czf "$out/$(basename "$run").tgz" --exclude='checkpoint*' "$run"
ls -la "$run"/checkpoint >> "$out/train.log" 2>&1
exit $rc
