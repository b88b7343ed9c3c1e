#!/usr/bin/env bash
# LoRA's two publishes on one GPU (results/algorithms/README.md, "LoRA against full fine-tuning"): `laminar bench
# trainer` with rank-32 adapters on every linear projection of attention and MLP publishing the merged model, then
# the adapters alone (`trainer.lora_publish=adapters`), then full fine-tuning for reference. Each row is the
# trainer's publish stall (the version into a shared-memory slot, finite check included), the bytes published,
# and a replica's load of that version on the same card from page-locked memory (`replica_apply_s_median`: the
# whole model copied in, or the base plus B A written into the adapted weights). SHAPES: the SmolLM2-135M shape
# of that table and larger ones beside it. Needs peft among the carried wheels (`.whl`, as gpu-algorithms.sh).
#   bash configs/gpu-lora-publish.sh                      rows in $OUT/lora-publish.md, each row's JSON beside
set -uo pipefail
out=${OUT:-runs/lora-publish}; mkdir -p "$out"
bash configs/device-setup.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
for shape in ${SHAPES:-smollm2-135m qwen2.5-0.5b qwen2.5-1.5b}; do
  for publish in full merged adapters; do
    lora=(--lora-rank 32 --lora-alpha 64 --lora-targets all-linear --lora-publish "$publish")
    [ "$publish" = full ] && lora=()
    python3 -m laminar.cli bench trainer --shape "$shape" --steps 2 --groups 16 --publishes 10 "${lora[@]}" \
      --out "$out/$shape-$publish" > "$out/$shape-$publish.log" 2>&1
    echo "$shape $publish: rc $?"
  done
done
python3 - "$out" <<'PY' | tee "$out/lora-publish.md"
import json, sys
from pathlib import Path

print("| shape | publish | published MiB | publish stall ms (median) | replica load ms (median) |")
print("|---|---|---|---|---|")
for f in sorted(Path(sys.argv[1]).glob("*/trainer.json")):
    r = json.loads(f.read_text())
    publish = (r.get("lora") or {}).get("publish", "full fine-tuning")
    apply = r["replica_apply_s_median"]
    print(f"| {r['shape']} | {publish} | {r['published_mib']} | {1e3 * r['publish_stall_s_median']:.1f} | "
          f"{'-' if apply is None else f'{1e3 * apply:.1f}'} |")
PY
