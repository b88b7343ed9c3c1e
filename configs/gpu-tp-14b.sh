#!/usr/bin/env bash
# The device run behind results/tensor-parallel's 14B section (4 GPUs; `.whl` carried): install Ray, write the
# random Qwen2.5-14B-shaped model, time the reference copy (one trainer rank's rows of the published bf16
# weights, GPU to pinned host memory), train configs/gpu-tp-14b.yaml, pack the run folder into $OUT.
#   bash configs/gpu-tp-14b.sh [OVERRIDES...]
set -uo pipefail
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-runs/device-out}
run=${RUN:-runs/tp14b}
mkdir -p "$out"
bash configs/device-setup.sh > /tmp/setup.log 2>&1 || exit 1  # only what the image lacks
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv; df -h /dev/shm /tmp; free -g; } \
  | tee "$out/machine.txt"
model=runs/models/qwen14b-random
[ -f $model/random_model.json ] || python3 -m laminar.bench.random_model --shape qwen2.5-14b --out $model
python3 - "$model" <<'PY' | tee "$out/pinned-copy.json"
import json, sys, time, torch
from laminar.runtime.memory import parameter_count
n = parameter_count(sys.argv[1]) // 2  # one of two FSDP ranks' rows, bf16
src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
dst = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
times = []
for _ in range(4):
    torch.cuda.synchronize(); t = time.perf_counter()
    dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
best = min(times[1:])
print(json.dumps({"what": "one trainer rank's published rows, GPU to pinned host memory", "bytes": 2 * n,
                  "seconds": round(best, 4), "GB_per_s": round(2 * n / best / 1e9, 1)}))
PY
date
timeout "${LIMIT_S:-$((540 - SECONDS))}" python3 -m laminar.cli train configs/gpu-tp-14b.yaml run.out="$run" "$@" 2>&1 \
  | tee "$out/train.log" | grep -v "Warning\|warn"
rc=$?
date
tar czf "$out/$(basename "$run").tgz" --exclude='checkpoint*' "$run"
[ $rc -eq 0 ] || tar czf "$out/raylogs.tgz" /tmp/ray/session_latest/logs 2>/dev/null
exit $rc
