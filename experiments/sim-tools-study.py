"""The tool workload in the cluster simulator (`laminar/sim/`): first against what the GPU measured
(results/schedules-tools-gpu), then the replicas' tool workers (`task.tool_workers`) swept, then how full the GPU
runs kept their tool pools (from their own step records). Writes results/sim-tools/study.json and study.md.

    python experiments/sim-tools-study.py [--records DIR]       (CPU, a few minutes with 2 processes)

The GPU runs' step records are not in the tree: `--records DIR` reads them from a copy of the commit that held
them (`mkdir DIR && git archive da10733 results/schedules-tools-gpu/three-replicas | tar -x -C DIR`); without
it, the pool table is the one in the committed study.json.

The simulated set-up is configs/gpu-schedules-tools.yaml: 1 trainer GPU and 2 or 3 rollout replicas, the
Qwen2.5-0.5B shape, the runtime's length workload replayed group by group (median 256, p99 10x, capped at 2048;
tool calls geometric with mean 2, latency lognormal with median 0.5 s and p99 5 s, 32 tokens of output each), 8
groups of 8 a step, 6 steps of which 2 warm-up, 3 steps of groups in flight, staleness 2 for stream and partial.
The cost model is the one calibrated on the schedule benchmark (`laminar.sim.validation.calibrated`); each run's
dispatch and repack settings are those its measured run had. Against the GPU, throughput is taken as the
benchmark takes it (`bench_throughput`: the tokens of the steps after the first measured one, over the time from
its end); the sweeps use the simulator's own window (from the end of warm-up), the same for every schedule.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

from laminar.sim.experiment import run_many
from laminar.sim.run import simulate
from laminar.sim.validation import bench_throughput, calibrated, small_gpu_config

RESULTS = Path(__file__).resolve().parents[1] / "results"
OUT = RESULTS / "sim-tools"
MEASURED = RESULTS / "schedules-tools-gpu"
SCHEDULES = ("sync", "one_step", "stream", "partial", "laminar")
# the runtime's defaults, and its policy of 2026-11-26
NOW = dict(schedule={"max_lag": 0}, repack=dict(only_with_work=True, newest_first=True, max_age=3))
BEFORE = dict(schedule={"max_lag": None}, repack=dict(only_with_work=True, newest_first=False, max_age=None))


def tools_config(cost, seed: int, replicas: int, policy: dict, **changes):
    small = small_gpu_config(cost)
    lengths = replace(
        small.lengths,
        median=256,
        max_response=2048,
        prompt_median=18,
        workload_seed=seed,
        tool_calls_mean=2.0,
        tool_latency_median_s=0.5,
        tool_latency_p99_ratio=10.0,
        tool_output_tokens=32,
    )
    return (
        small.with_(
            seed=seed,
            steps=6,
            warmup_steps=2,
            gpus=replicas + 1,
            trainer_frac=1 / (replicas + 1),
            repack=dict(capped_batch_limit_b=0),
            lengths=lengths,
        )
        .with_(**policy)
        .with_(**changes)
    )


def measured() -> list[dict]:
    """(replicas, seed, schedule, training tokens/s) of every GPU run of the tool workload."""
    rows = []
    for replicas, seed, path in (
        (2, 0, MEASURED / "schedules.json"),
        (3, 0, MEASURED / "three-replicas" / "schedules.json"),
        (3, 1, MEASURED / "three-replicas" / "seed1-laminar" / "schedules.json"),
        (3, 1, MEASURED / "three-replicas" / "seed1-sync" / "schedules.json"),
    ):
        for r in json.loads(path.read_text())["results"]:
            rows.append(
                {"replicas": replicas, "seed": seed, "schedule": r["label"], "gpu": r["train_tokens_per_s"]}
            )
    return rows


def pool_use(records: Path | None) -> tuple[list[dict], list[str]]:
    """From the GPU runs' own step records under `records` (else the committed table): tool calls made in the
    measured steps (after the 2 warm-up steps), over the measured window, per replica, against what 4 workers
    serve (a lognormal latency's mean is its median times exp(sigma^2 / 2))."""
    sigma = math.log(10.0) / 2.3263
    capacity = 4 / (0.5 * math.exp(sigma * sigma / 2))
    rows = (
        pool_rows(records / "results" / "schedules-tools-gpu" / "three-replicas")
        if records
        else json.loads((OUT / "study.json").read_text())["gpu_pool_use"]
    )
    lines = [
        "",
        f"## The GPU runs' tool pools: 4 workers a replica serve {capacity:.1f} calls a second",
        "",
        "| three replicas | tool calls / s / replica | share of 4 workers' capacity | calls a trajectory |",
        "|---|---|---|---|",
    ]
    for r in rows:
        rate, per_trajectory = r["calls_per_s_per_replica"], r["calls_per_trajectory"]
        lines.append(f"| {r['run']} | {rate:.2f} | {rate / capacity:.0%} | {per_trajectory:.2f} |")
    return rows, lines


def pool_rows(runs: Path) -> list[dict]:
    rows = []
    for name, folder in (
        ("laminar, seed 0", runs / "laminar"),
        ("sync, seed 0", runs / "sync"),
        ("laminar, seed 1", runs / "seed1-laminar"),
        ("sync, seed 1", runs / "seed1-sync"),
    ):
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if r["kind"] == "step"]
        span = steps[-1]["t"] - steps[1]["t"]
        calls = sum(r["tool_calls_mean"] * r["trajectories"] for r in steps[2:])
        trajectories = sum(r["trajectories"] for r in steps[2:])
        rate = calls / span / 3
        rows.append(
            {"run": name, "calls_per_s_per_replica": rate, "calls_per_trajectory": calls / trajectories}
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=Path, help="a folder holding the GPU runs' step records (see above)")
    args = ap.parse_args()
    cost, _ = calibrated()
    rows = measured()
    for r in rows:  # throughput measured as the benchmark measures it, over the same steps
        policy = BEFORE if r["replicas"] == 2 else NOW
        summary, cluster = simulate(
            tools_config(cost, r["seed"], r["replicas"], policy).with_(schedule=r["schedule"])
        )
        r["sim"] = bench_throughput(cluster)
        r["staleness_p99"] = summary["staleness"]["p99"]
    lines = [
        "## Against the GPU runs (4 tool workers a replica, as measured)",
        "",
        "| replicas | seed | schedule | GPU tok/s | simulated tok/s | simulated / GPU |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['replicas']} | {r['seed']} | {r['schedule']} | {r['gpu']:,.0f} | {r['sim']:,.0f} | "
            f"{r['sim'] / r['gpu']:.2f} |"
        )
    sweep: dict[str, dict] = {}
    for steps, warmup in ((6, 2), (40, 4)):
        lines += sweep_workers(cost, steps, warmup, sweep)
    knobs, part = staleness_knobs(cost)
    lines += part
    pools, part = pool_use(args.records)
    lines += part
    (OUT / "study.json").write_text(
        json.dumps(
            {"validation": rows, "tool_workers": sweep, "staleness_knobs": knobs, "gpu_pool_use": pools},
            indent=1,
        )
        + "\n"
    )
    (OUT / "study.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def sweep_workers(cost, steps: int, warmup: int, sweep: dict) -> list[str]:
    """Every schedule at 4 to 64 tool workers a replica, over `steps` steps (the GPU runs had 6)."""
    lines = [
        "",
        f"## Tool workers a replica: {steps} steps, {warmup} of them warm-up (3 replicas, the runtime's "
        "defaults, mean of seeds 0 and 1)",
        "",
        "| tool workers | "
        + " | ".join(SCHEDULES)
        + " | laminar / sync | laminar / best baseline | laminar staleness p99 |",
        "|---|" + "---|" * (len(SCHEDULES) + 3),
    ]
    for workers in (4, 16, 32, 64):
        cfgs = [
            tools_config(cost, seed, 3, NOW, tool_workers=workers).with_(
                schedule=s, steps=steps, warmup_steps=warmup
            )
            for seed in (0, 1)
            for s in SCHEDULES
        ]
        out = run_many(cfgs, 2)
        by = {s: [o for c, o in zip(cfgs, out) if c.schedule.name == s] for s in SCHEDULES}
        mean = {s: statistics.mean(o["training_throughput"] for o in by[s]) for s in SCHEDULES}
        p99 = max(o["staleness"]["p99"] for o in by["laminar"])
        best = max(mean[s] for s in SCHEDULES if s != "laminar")
        sweep[f"{steps} steps, {workers} workers"] = {
            "mean_tokens_per_s": mean,
            "laminar_staleness_p99_max": p99,
        }
        cells = " | ".join(f"{mean[s]:,.0f}" for s in SCHEDULES)
        lines.append(
            f"| {workers} | {cells} | {mean['laminar'] / mean['sync']:.2f}x | {mean['laminar'] / best:.2f}x | {p99} |"
        )
    return lines


KNOBS = (
    ("the defaults (3 steps of groups in flight)", {}),
    ("2.75 steps in flight", {"max_ahead_batches": 2.75}),
    ("2.5 steps in flight", {"max_ahead_batches": 2.5}),
    ("repack max_age 1", {"repack": {"max_age": 1}}),
    ("repack ramp_down_frac 0.5", {"repack": {"ramp_down_frac": 0.5}}),
    ("without repack", {"schedule": "laminar_no_repack"}),
)


def staleness_knobs(cost) -> tuple[list[dict], list[str]]:
    """Laminar with 32 tool workers over 40 steps, four seeds: what keeps its staleness p99 within 4, at what
    cost in throughput."""
    lines = [
        "",
        "## Laminar's staleness on the tool workload: 32 tool workers, 40 steps, seeds 0-3",
        "",
        "| variant | training tok/s (mean) | vs the defaults | staleness p99 by seed | max by seed |",
        "|---|---|---|---|---|",
    ]
    rows, base = [], None
    for name, kw in KNOBS:
        cfgs = [
            tools_config(cost, seed, 3, NOW, tool_workers=32).with_(
                **{"schedule": "laminar", "steps": 40, "warmup_steps": 4, **kw}
            )
            for seed in range(4)
        ]
        out = run_many(cfgs, 2)
        mean = statistics.mean(o["training_throughput"] for o in out)
        base = base or mean
        p99 = [o["staleness"]["p99"] for o in out]
        top = [o["staleness"]["max"] for o in out]
        rows.append({"variant": name, "mean_tokens_per_s": mean, "staleness_p99": p99, "staleness_max": top})
        lines.append(
            f"| {name} | {mean:,.0f} | {mean / base:.3f} | {', '.join(map(str, p99))} | {', '.join(map(str, top))} |"
        )
    return rows, lines


if __name__ == "__main__":
    main()
