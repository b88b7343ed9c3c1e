#!/usr/bin/env bash
# The tool workload again with the runtime's current defaults, on 4 GPUs (1 trainer, 3 replicas), two seeds of
# sync and laminar, then one_step: `OUT=DIR bash results/schedules-tools-gpu/repeats.sh` (`.whl` carried).
# Each part is packed into one tarball as soon as it ends, so a run cut short still returns what finished.
set -uo pipefail
root=${OUT:-runs/device-out}
export CONFIG=configs/gpu-schedules-tools.yaml
part() {  # part NAME BENCH_DIR SCHEDULES [OVERRIDES...]
  local name=$1 bench=$2 only=$3; shift 3
  OUT=$root/$name BENCH=$bench bash configs/gpu-schedules.sh "$only" "$@"
  (cd "$root" && tar czf "$name.tgz" "$name" && rm -rf "$name")
}
part seed0 runs/tools-seed0 sync,laminar
part seed1 runs/tools-seed1 sync,laminar task.seed=1 run.seed=1
part seed0-one-step runs/tools-seed0 one_step
