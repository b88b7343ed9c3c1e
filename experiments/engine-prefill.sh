#!/usr/bin/env bash
# One prefill per group (GPU machine): `laminar bench batches` on the Qwen2.5-0.5B shape, 128 samples a batch,
# prompts of 512 and 2048 tokens, groups of 8 and 16, answers lognormal (median 256, sigma 0.6, at most 1024),
# each with the group's prompt shared (--share on, the engine's way) and prefilled by every sample (--share off).
#   bash experiments/engine-prefill.sh OUT_DIR
set -u
OUT=${1:-results/engine-prefill}
for prompt in 512 2048; do
  for g in 8 16; do
    for share in off on; do
      name=p${prompt}-g${g}-share-${share}
      echo "== $name"
      python3 -m laminar.cli bench batches --shape qwen2.5-0.5b --samples 128 --group-size $g --prompt $prompt \
        --answer-median 256 --answer-sigma 0.6 --answer-max 1024 --batches 3 --share $share --out "$OUT/$name" \
        2>&1 | grep -v "Warning\|warn(" | tail -2
    done
  done
done
