#!/usr/bin/env bash
# The tool workload with the runtime's current defaults, on 4 GPUs (1 trainer, 3 replicas), two seeds of sync
# and laminar, then one_step: `OUT=DIR bash experiments/schedules-tools-gpu.sh` (`.whl` carried).
# Each part is packed into one tarball as soon as it ends, so a run cut short still returns what finished.
#   PARTS="seed1-laminar seed1-sync" EXTRA="trainer.steps=12" OUT=DIR bash experiments/schedules-tools-gpu.sh
#   (PARTS, default "seed0 seed1 seed0-one-step": any of those and seed0-laminar, seed0-sync, seed1-laminar,
#   seed1-sync, one schedule a device call when they take minutes; EXTRA: overrides for every part).
#   `laminar bench seeds` puts the seeds together.
set -uo pipefail
root=${OUT:-runs/device-out}
parts=${PARTS:-seed0 seed1 seed0-one-step}
export CONFIG=configs/gpu-schedules-tools.yaml
part() {  # part NAME BENCH_DIR SCHEDULES [OVERRIDES...]
  local name=$1 bench=$2 only=$3; shift 3
  [[ " $parts " == *" $name "* ]] || return 0
  # shellcheck disable=SC2086  # EXTRA is a list of overrides
  OUT=$root/$name BENCH=$bench bash configs/gpu-schedules.sh "$only" "$@" ${EXTRA:-}
  (cd "$root" && tar czf "$name.tgz" "$name" && rm -rf "$name")
}
part seed0 runs/tools-seed0 sync,laminar
part seed1 runs/tools-seed1 sync,laminar task.seed=1 run.seed=1
part seed0-laminar runs/tools-seed0-laminar laminar
part seed0-sync runs/tools-seed0-sync sync
part seed1-laminar runs/tools-seed1-laminar laminar task.seed=1 run.seed=1
part seed1-sync runs/tools-seed1-sync sync task.seed=1 run.seed=1
part seed0-one-step runs/tools-seed0 one_step
