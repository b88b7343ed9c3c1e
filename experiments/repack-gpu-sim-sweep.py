"""The rollout-bound repack configuration (configs/gpu-repack.yaml) in the cluster simulator: Laminar with and
without repack, and the knobs that trade repack's gain against staleness, over six workload seeds, at 8 groups
a step (the first GPU runs) and at 16 (the configuration now). Writes sim-sweep.json and sim-sweep.md into
results/repack-gpu.

    python experiments/repack-gpu-sim-sweep.py

The simulator's small-GPU model (`laminar.sim.validation.small_gpu_config`: 1 trainer and 3 replicas, H200
costs, uncalibrated) with the runtime's dispatch defaults and this configuration's lengths: responses of median
512 (p99 10x, capped at 4096), 257-token prompts, 12 steps of 8 or 16 groups of 8, 3 of them warm-up.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from laminar.sim.experiment import run_many
from laminar.sim.validation import small_gpu_config

SEEDS = range(6)
VARIANTS = [
    ("without repack", {"schedule": "laminar_no_repack"}),
    ("repack (the defaults)", {}),
    ("repack, ramp_down_frac 0.9", {"repack": {"ramp_down_frac": 0.9}}),
    ("repack, ramp_down_frac 0.8", {"repack": {"ramp_down_frac": 0.8}}),
    ("repack, ramp_down_frac 0.7", {"repack": {"ramp_down_frac": 0.7}}),
    ("repack, max_age 1", {"repack": {"max_age": 1}}),
    ("repack, oldest tails first", {"repack": {"newest_first": False}}),
    ("repack, 2.5 steps in flight", {"max_ahead_batches": 2.5}),
    ("repack, 2 steps in flight", {"max_ahead_batches": 2.0}),
    ("without repack, 2.5 steps in flight", {"schedule": "laminar_no_repack", "max_ahead_batches": 2.5}),
]


def base(seed: int, groups_per_step: int):
    small = small_gpu_config()
    lengths = replace(small.lengths, median=512, max_response=4096, prompt_median=257, workload_seed=seed)
    return small.with_(
        seed=seed,
        steps=12,
        warmup_steps=3,
        # the runtime's dispatch defaults (small_gpu_config pins the older runs' policy)
        schedule={"name": "laminar", "max_lag": 0},
        repack=dict(only_with_work=True, newest_first=True, max_age=3),
        lengths=lengths,
        groups_per_step=groups_per_step,
    )


def table(groups_per_step: int) -> tuple[dict[str, list[dict]], list[str]]:
    runs: dict[str, list[dict]] = {name: [] for name, _ in VARIANTS}
    for seed in SEEDS:
        out = run_many([base(seed, groups_per_step).with_(**kw) for _, kw in VARIANTS], 2)
        for (name, _), o in zip(VARIANTS, out):
            runs[name].append(
                {
                    "seed": seed,
                    "training_throughput": o["training_throughput"],
                    "staleness_p99": o["staleness"]["p99"],
                    "staleness_max": o["staleness"]["max"],
                }
            )
    ref = statistics.mean(r["training_throughput"] for r in runs["without repack"])
    lines = [
        f"{groups_per_step} groups of 8 a step:",
        "",
        "| variant | training tok/s (mean of 6 seeds) | vs without repack | staleness p99 by seed |",
        "|---|---|---|---|",
    ]
    for name, _ in VARIANTS:
        mean = statistics.mean(r["training_throughput"] for r in runs[name])
        p99 = ", ".join(str(r["staleness_p99"]) for r in runs[name])
        lines.append(f"| {name} | {mean:,.0f} | {mean / ref:.2f}x | {p99} |")
    return runs, lines


def main() -> None:
    runs, lines = {}, []
    for groups_per_step in (8, 16):
        runs[f"groups_per_step={groups_per_step}"], part = table(groups_per_step)
        lines += [*part, ""]
    here = Path(__file__).resolve().parents[1] / "results" / "repack-gpu"
    (here / "sim-sweep.json").write_text(json.dumps(runs, indent=1) + "\n")
    (here / "sim-sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
