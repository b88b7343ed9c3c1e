#!/usr/bin/env bash
# Repack where rollouts are the bottleneck (configs/gpu-repack.yaml, 4 GPUs; `.whl` carried): laminar with
# and without repack, two seeds, each seed's pair packed into one tarball as soon as it ends.
#   OUT=DIR [SEEDS="0 1"] bash experiments/repack-gpu.sh [SCHEDULES [OVERRIDES...]]
#   (SCHEDULES also laminar-movekv, laminar-rampdown; e.g. trainer.groups_per_step=8 for the first runs)
set -uo pipefail
root=${OUT:-runs/device-out}
only=${1:-laminar,laminar-norepack}
shift || true
export CONFIG=configs/gpu-repack.yaml
for seed in ${SEEDS:-0 1}; do
  OUT=$root/repack-seed$seed BENCH=runs/repack-seed$seed bash configs/gpu-schedules.sh "$only" \
    task.seed=$seed run.seed=$seed "$@"
  (cd "$root" && tar czf "repack-seed$seed.tgz" "repack-seed$seed" && rm -rf "repack-seed$seed")
done
