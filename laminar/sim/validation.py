"""Validation against our own measured schedule benchmark at small scale (within 15% per schedule).

The simulated set-up is the measured one (`configs/gpu-schedules.yaml` with `trainer.steps=12`,
results/schedules-gpu-repeats): 4 GPUs, 1 trainer GPU + 3 rollout replicas of one GPU, Qwen2.5-0.5B shape on
H200s, 8 groups x 8 samples a step, 12 steps of which 2 warm-up, the runtime's own length workload replayed
group by group in each run's order (`lengths.kind: bench`, run seed 0 and 1), 4 groups a replica takes at once,
24 groups (3 steps) dispatched and not trained for Laminar, staleness 2 for stream / partial, repack with
B = 256 every 0.25 s and, as in those runs, without the `only_with_work` gate. Every variant ran once per seed.
The cost model is calibrated once for every schedule (`laminar.sim.calibrate.from_schedule_bench`; the values fitted
on those runs are `laminar.sim.measured.SMALL_GPU`); throughput is computed as the benchmark computes it (`laminar.telemetry.summary`: tokens of the steps after the first measured one over
the time from its end to the last step's end).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from laminar.config import RepackConfig, ScheduleConfig
from laminar.sim.calibrate import ScheduleCalibration, from_schedule_bench
from laminar.sim.config import SimConfig
from laminar.sim.cost import MODELS, CostModel
from laminar.sim.lengths import LengthConfig
from laminar.sim.measured import SMALL_GPU
from laminar.sim.run import simulate

SEEDS = (0, 1)  # run.seed of the two measured sets, in the order of `ScheduleCalibration.runs`
# simulator schedule -> the benchmark's variant label
VARIANTS = {
    "sync": "sync",
    "one_step": "one_step",
    "stream": "stream",
    "partial": "partial",
    "laminar": "laminar",
    "laminar_no_repack": "laminar-norepack",
    "laminar_global_push": "laminar-globalpush",
}
TOLERANCE = 0.15


def small_gpu_config(cost: CostModel | None = None, **changes: Any) -> SimConfig:
    """`configs/gpu-schedules.yaml` (12 steps) as a simulator configuration (uncalibrated H200 costs if none)."""
    base = SimConfig(
        gpus=4,
        model="0.5B",
        trainer_frac=0.25,  # 1 trainer GPU, 3 rollout replicas (TP 1)
        groups_per_step=8,
        group_size=8,
        steps=12,
        warmup_steps=2,
        # the runtime's schedule section when the measured runs were made: k 2 for stream / partial, and
        # Laminar's dispatch before the version gate (`max_lag`) and the staleness bound (`max_staleness`)
        schedule=ScheduleConfig(staleness=2, max_lag=None, max_staleness=None),
        max_ahead_batches=3.0,  # buffer.capacity_groups = 24 = 3 global batches
        replica_fill=4 * 8 / 256,  # rollout.groups_per_batch = 4 groups of 8 of max_num_seqs = 256
        # the runtime's repack policy when the measured runs were made: before the gate (`only_with_work`)
        # and the staleness tail's rules
        repack=RepackConfig(
            interval_s=0.25,
            kv_capacity=0.9,
            batch_limit_b=256,
            only_with_work=False,
            newest_first=False,
            max_age=None,
            capped_batch_limit_b=0,
        ),
        lengths=LengthConfig(
            kind="bench",
            median=256,
            p99_over_median=10.0,
            max_response=2048,
            prompt_median=18,
            drift_per_step=0.0,
            num_prompts=4096,
        ),  # prompts: 18 tokens (the step records' tokens - response_tokens = 18 x 64)
        cost=cost or CostModel.h200(),
    )
    return base.with_(**changes)


def bench_throughput(cluster) -> float:
    """Training throughput as `laminar.telemetry.summary` measures it."""
    rec, w = cluster.record, cluster.cfg.warmup_steps
    span = rec.step_end[-1] - rec.step_end[w]
    return sum(rec.step_tokens[w + 1 :]) / span


def calibrated(
    train_shift_s: float = 0.0, calibration: ScheduleCalibration = SMALL_GPU
) -> tuple[CostModel, dict[str, str]]:
    """The measured cost model of the small GPU set-up (its trainer's fixed cost moved by `train_shift_s`) and
    a note a constant of where it comes from."""
    return calibration.with_train_shift(train_shift_s), calibration.notes


def calibration_from_files(engine_bench: str | Path, runs: list[str | Path]) -> ScheduleCalibration:
    """The calibration fitted again on the measurement's files: the engine benchmark of the card, and one folder a
    measured set (its variants' run folders, with `metrics.jsonl` and `summary.json`), in the order of `SEEDS`."""
    if len(runs) != len(SEEDS):
        raise ValueError(f"{len(runs)} run folders given, the validation has one a seed of {SEEDS}")
    return from_schedule_bench(engine_bench, small_gpu_config().cost, MODELS["0.5B"].params, runs)


def run_validation(out: Path, calibration: ScheduleCalibration = SMALL_GPU) -> dict[str, Any]:
    cost, notes = calibrated(0.0, calibration)
    window_sd = calibration.window_sd_s  # the noise of a 10-step window's mean trainer step
    band = {s: calibration.with_train_shift(s) for s in (-window_sd, window_sd)}
    rows = []
    for name, label in VARIANTS.items():
        per_seed = []
        for seed, runs in zip(SEEDS, calibration.runs):
            m = runs[label]
            summary, cluster = simulate(small_gpu_config(cost, schedule=name, seed=seed))
            sim = bench_throughput(cluster)
            spread = [
                bench_throughput(simulate(small_gpu_config(c, schedule=name, seed=seed))[1])
                for c in band.values()
            ]
            got = m.train_tok_s
            per_seed.append(
                {
                    "seed": seed,
                    "run": m.source,
                    "measured_train_tok_s": got,
                    "simulated_train_tok_s": round(sim, 1),
                    "error": round(sim / got - 1, 4),
                    "simulated_at_train_fixed_minus_plus_sd": [round(x, 1) for x in spread],
                    "window_train_step_s_measured_vs_fit": list(m.window_step_s),
                    "measured_staleness_max": m.staleness_max,
                    "simulated_staleness_max": summary["staleness"]["max"],
                    "measured_reprefill_tokens": m.reprefill_tokens,
                    "simulated_reprefill_tokens": round(summary["reprefill_tokens"]),
                    "simulated_repacks": summary["repacks"]["count"],
                    "measured_repacks": m.repacks,
                }
            )
        measured = float(np.mean([r["measured_train_tok_s"] for r in per_seed]))
        simulated = float(np.mean([r["simulated_train_tok_s"] for r in per_seed]))
        err = simulated / measured - 1
        rows.append(
            {
                "schedule": name,
                "variant": label,
                "measured_train_tok_s_mean": round(measured, 1),
                "simulated_train_tok_s_mean": round(simulated, 1),
                "error": round(err, 4),
                "within_15pct": abs(err) <= TOLERANCE,
                "runs": per_seed,
            }
        )
    result = {
        "setup": "configs/gpu-schedules.yaml trainer.steps=12 on 4 x H200: 1 trainer GPU + 3 rollout replicas, "
        "Qwen2.5-0.5B shape, lengths lognormal median 256 p99 10x cap 2048 (each run's own groups), 8 x 8 a "
        "step, 12 steps, 2 warm-up; run seeds 0 and 1",
        "calibration": notes,
        "trainer_window_sd_s": round(window_sd, 3),
        "tolerance": TOLERANCE,
        "rows": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "validation.json").write_text(json.dumps(result, indent=1))
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        "| schedule | measured train tok/s, seed 0 / 1 (mean) | simulated, seed 0 / 1 (mean) | error of the mean "
        f"| within 15% | simulated mean, trainer fixed cost -/+ {result['trainer_window_sd_s']:.2f} s "
        "| trainer step in window, measured / fit (s) | staleness max, measured / simulated "
        "| re-prefilled tokens, measured / simulated |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        a, b = r["runs"]
        lo = np.mean([x["simulated_at_train_fixed_minus_plus_sd"][0] for x in r["runs"]])
        hi = np.mean([x["simulated_at_train_fixed_minus_plus_sd"][1] for x in r["runs"]])
        steps = " / ".join(
            f"{x['window_train_step_s_measured_vs_fit'][0]:.2f}, {x['window_train_step_s_measured_vs_fit'][1]:.2f}"
            for x in r["runs"]
        )
        lines.append(
            f"| {r['schedule']} | {a['measured_train_tok_s']:,.0f} / {b['measured_train_tok_s']:,.0f} "
            f"({r['measured_train_tok_s_mean']:,.0f}) "
            f"| {a['simulated_train_tok_s']:,.0f} / {b['simulated_train_tok_s']:,.0f} "
            f"({r['simulated_train_tok_s_mean']:,.0f}) | {r['error']:+.1%} "
            f"| {'yes' if r['within_15pct'] else '**no**'} | {lo:,.0f} / {hi:,.0f} | {steps} "
            f"| {max(a['measured_staleness_max'], b['measured_staleness_max'])} / "
            f"{max(a['simulated_staleness_max'], b['simulated_staleness_max'])} "
            f"| {a['measured_reprefill_tokens'] + b['measured_reprefill_tokens']:,} / "
            f"{a['simulated_reprefill_tokens'] + b['simulated_reprefill_tokens']:,} |"
        )
    return "\n".join(lines)
