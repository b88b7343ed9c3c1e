"""Validation against our own measured schedule benchmark at small scale (issue 6: within 15% per schedule).

The simulated set-up is the measured one (`configs/gpu-schedules.yaml`, results/schedules-gpu): 4 GPUs, 1
trainer GPU + 3 rollout replicas of one GPU, Qwen2.5-0.5B shape on H200s, 8 groups x 8 samples a step, 6
steps of which 2 warm-up, the runtime's own length workload replayed group by group (`lengths.kind: bench`),
4 groups a replica takes at once, 24 groups (3 steps) dispatched and not trained for Laminar, staleness 2 for
stream / partial, repack every 1 s with B = 256. The cost model is calibrated once for every schedule
(`laminar.sim.calibrate.from_schedule_bench`); throughput is computed as the benchmark computes it
(`laminar.telemetry.summary`: tokens of the steps after the first measured one over the time from its end to
the last step's end).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from laminar.sim.calibrate import fit_trainer, from_schedule_bench, gpu_run_steps
from laminar.sim.config import SimConfig
from laminar.sim.cost import MODELS, CostModel
from laminar.sim.lengths import LengthConfig
from laminar.sim.run import simulate

ENGINE = "results/engine-cuda.json"
MEASURED = "results/schedules-gpu/schedules.json"
ABLATION = "results/schedules-gpu/repack-ablation/schedules.json"
SCHEDULES = ("sync", "one_step", "stream", "partial", "laminar")
BENCH_NAMES = {"laminar_no_repack": "laminar-norepack"}
TOLERANCE = 0.15


def small_gpu_config(cost: CostModel | None = None, **changes: Any) -> SimConfig:
    """`configs/gpu-schedules.yaml` as a simulator configuration (uncalibrated H200 costs if none given)."""
    base = SimConfig(
        gpus=4,
        model="0.5B",
        trainer_frac=0.25,  # 1 trainer GPU, 3 rollout replicas (TP 1)
        groups_per_step=8,
        group_size=8,
        steps=6,
        warmup_steps=2,
        staleness_k=2,  # schedule.staleness
        max_ahead_batches=3.0,  # buffer.capacity_groups = 24 = 3 global batches
        replica_fill=4 * 8 / 256,  # rollout.groups_per_batch = 4 groups of 8 of max_num_seqs = 256
        repack_interval_s=1.0,
        repack_kv_frac=0.9,
        repack_batch_limit=256,
        lengths=LengthConfig(
            kind="bench",
            median=256,
            p99_over_median=10.0,
            max_response=2048,
            prompt_median=18,
            drift_per_step=0.0,
            num_prompts=4096,
        ),  # prompts: 18 tokens (164,624 trained tokens = 8 x sum of the 48 first groups' lengths + 18 x 384)
        cost=cost or CostModel.h200(),
    )
    return base.with_(**changes)


def bench_throughput(cluster) -> float:
    """Training throughput as `laminar.telemetry.summary` measures it."""
    rec, w = cluster.record, cluster.cfg.warmup_steps
    span = rec.step_end[-1] - rec.step_end[w]
    return sum(rec.step_tokens[w + 1 :]) / span


def calibrated(train_shift_s: float = 0.0) -> tuple[CostModel, dict[str, str]]:
    cfg = small_gpu_config()
    return from_schedule_bench(ENGINE, MEASURED, cfg.cost, MODELS["0.5B"].params, train_shift_s=train_shift_s)


def train_band_s() -> float:
    """The noise of a 3-step window's mean trainer step: the fit's residual sd over sqrt(3). The sensitivity
    columns shift the fitted fixed cost by minus and plus this much."""
    return fit_trainer(gpu_run_steps())["residual_sd_s"] / 3**0.5


def run_validation(out: Path) -> dict[str, Any]:
    cost, notes = calibrated()
    band_s = train_band_s()
    steps = gpu_run_steps()
    fit = fit_trainer(steps)
    band = {s: calibrated(s)[0] for s in (-band_s, band_s)}
    measured = {r["schedule"]: r for r in json.loads(Path(MEASURED).read_text())["results"]}
    ablation = {r["label"]: r for r in json.loads(Path(ABLATION).read_text())["results"]}
    rows = []
    for name in (*SCHEDULES, "laminar_no_repack"):
        summary, cluster = simulate(small_gpu_config(cost, schedule=name))
        sim = bench_throughput(cluster)
        spread = [bench_throughput(simulate(small_gpu_config(c, schedule=name))[1]) for c in band.values()]
        runs = []
        if name in measured:
            runs.append(("results/schedules-gpu", measured[name]))
        label = BENCH_NAMES.get(name, name)
        if label in ablation:
            runs.append(("results/schedules-gpu/repack-ablation", ablation[label]))
        for source, m in runs:
            got = m["train_tokens_per_s"]
            window = [
                r
                for r in steps[f"{Path(source).name}/{label}"]
                if r["step"] > small_gpu_config().warmup_steps + 1
            ]
            measured_train = sum(r["step_time_s"] for r in window) / len(window)
            fitted_train = sum(fit["fixed_s"] + fit["per_token_s"] * r["tokens"] for r in window) / len(
                window
            )
            err = sim / got - 1
            rows.append(
                {
                    "schedule": name,
                    "source": source,
                    "measured_train_tok_s": got,
                    "simulated_train_tok_s": round(sim, 1),
                    "error": round(err, 4),
                    "within_15pct": abs(err) <= TOLERANCE,
                    "simulated_at_train_fixed_minus_plus_band": [round(x, 1) for x in spread],
                    "window_train_step_s_measured_vs_fit": [round(measured_train, 3), round(fitted_train, 3)],
                    "measured_gen_tok_s": m["gen_tokens_per_s"],
                    "simulated_gen_tok_s": round(summary["generation_throughput"], 1),
                    "measured_staleness_max": m["staleness"]["max"],
                    "simulated_staleness_max": summary["staleness"]["max"],
                    "simulated_step_time_s": round(summary["step_time_s"], 3),
                    "simulated_gpu_utilisation": round(summary["gpu_utilisation"], 3),
                    "measured_busy": m.get("utilisation", {}).get("busy"),
                    "simulated_trainer_time": {k: round(v, 3) for k, v in summary["trainer_time"].items()},
                }
            )
    result = {
        "setup": "configs/gpu-schedules.yaml on 4 x H200: 1 trainer GPU + 3 rollout replicas, Qwen2.5-0.5B "
        "shape, lengths lognormal median 256 p99 10x cap 2048 (the run's own groups), 8 x 8 a step, 6 steps, "
        "2 warm-up",
        "calibration": notes,
        "train_band_s": round(band_s, 3),
        "tolerance": TOLERANCE,
        "rows": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "validation.json").write_text(json.dumps(result, indent=1))
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        "| schedule | measured run | measured train tok/s | simulated | error | within 15% "
        f"| simulated, trainer fixed cost -/+ {result['train_band_s']:.2f} s "
        "| trainer step in window, measured / fit | gen tok/s measured / simulated "
        "| staleness max measured / simulated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lo, hi = r["simulated_at_train_fixed_minus_plus_band"]
        mt, ft = r["window_train_step_s_measured_vs_fit"]
        lines.append(
            f"| {r['schedule']} | {r['source'].removeprefix('results/schedules-gpu').strip('/') or 'main'} "
            f"| {r['measured_train_tok_s']:,.0f} | {r['simulated_train_tok_s']:,.0f} | {r['error']:+.1%} "
            f"| {'yes' if r['within_15pct'] else '**no**'} | {lo:,.0f} / {hi:,.0f} "
            f"| {mt:.2f} / {ft:.2f} s | {r['measured_gen_tok_s']:,.0f} / {r['simulated_gen_tok_s']:,.0f} "
            f"| {r['measured_staleness_max']} / {r['simulated_staleness_max']} |"
        )
    return "\n".join(lines)
