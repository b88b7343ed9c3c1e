#!/usr/bin/env bash
# The device run behind results/schedules-gpu (run through the device tool with `.whl` carried, made by
# `bash ../shared/device/fetch-ray-wheels.sh .whl`): install Ray from the wheels, write the random
# Qwen2.5-0.5B-shaped model, run `laminar bench schedules` on configs/gpu-schedules.yaml, pack results into $OUT.
#   bash configs/gpu-schedules.sh sync,one_step,stream,partial,laminar [OVERRIDES...]
#   CONFIG=configs/gpu-schedules-tools.yaml bash configs/gpu-schedules.sh ...   (the tool workload)
#   BENCH=runs/seed1 bash configs/gpu-schedules.sh ... task.seed=1 run.seed=1      (another run folder)
set -uo pipefail
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-runs/device-out}; only=$1; shift
config=${CONFIG:-configs/gpu-schedules.yaml}
bench=${BENCH:-runs/bench}
mkdir -p "$out"
bash configs/device-setup.sh > /tmp/setup.log 2>&1 || exit 1  # only what the image lacks
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv
python3 -c 'import ray, yaml, matplotlib; print("ray", ray.__version__)' || exit 1
model=runs/models/qwen0.5b-random
[ -f $model/model.safetensors ] || python3 -m laminar.bench.random_model --shape qwen2.5-0.5b --out $model
date
python3 -m laminar.cli bench schedules --config "$config" --out "$bench" --only "$only" "$@" \
  2>&1 | tee "$out/bench.log"
rc=$?
date
cp "$bench"/schedules.json "$bench"/schedules.md "$bench"/*.png "$out/" 2>/dev/null
tar czf "$out/runs.tgz" --exclude='checkpoint*' "$bench"
[ $rc -eq 0 ] || tar czf "$out/raylogs.tgz" /tmp/ray/session_latest/logs 2>/dev/null
exit $rc
