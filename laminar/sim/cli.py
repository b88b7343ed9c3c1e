"""`laminar simulate`: run schedules on the simulated cluster, plan a layout, or reproduce the paper's grid."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from laminar.sim.calibrate import from_engine_bench, from_trainer_rows, trainer_rows
from laminar.sim.config import SCHEDULES, load_config
from laminar.sim.cost import MODELS, CostModel
from laminar.sim.experiment import bench, paper_experiment, plan, run_many
from laminar.sim.measured import (
    ENGINE_DECODE_MEM_EFF,
    ENGINE_NOTE,
    SMALL_GPU,
    TP_LAYER_LATENCY_S,
    TP_NOTE,
    TRAINER_ROWS,
)
from laminar.sim.plots import plot_runs


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laminar simulate", description=__doc__)
    p.add_argument(
        "--config",
        help="YAML file of SimConfig fields (the runtime's `schedule:` and `repack:` sections, and `lengths:` and `cost:`)",
    )
    p.add_argument("--out", default="runs/sim", help="directory for summary.json and plots")
    p.add_argument("--schedule", default="all", help=f"comma list or 'all' of: {', '.join(SCHEDULES)}")
    p.add_argument("--gpus", type=int)
    p.add_argument("--model", help="0.5B, 7B, 32B or 72B")
    p.add_argument("--steps", type=int)
    p.add_argument("--workers", type=int, default=2, help="processes for many runs")
    p.add_argument(
        "--plan", action="store_true", help="recommend the trainer/rollout split for --gpus/--model"
    )
    p.add_argument("--paper", action="store_true", help="the paper's grid: 64..1024 GPUs x 7B/32B/72B")
    p.add_argument("--bench", action="store_true", help="time 100 steps of a 1024-GPU simulation")
    p.add_argument(
        "--validate", action="store_true", help="simulate the measured small GPU schedule benchmark"
    )
    p.add_argument(
        "--engine-bench",
        nargs="+",
        default=[],
        metavar="FILE",
        help="`laminar bench engine` JSON to fit the decode efficiency on (default: the committed H200 measurement, "
        "laminar/sim/measured.py)",
    )
    p.add_argument(
        "--trainer-bench",
        nargs="+",
        default=[],
        metavar="FILE",
        help="`laminar bench trainer` JSON rows to take the trainer's MFU from (default: the committed rows)",
    )
    p.add_argument(
        "--schedule-runs",
        nargs="+",
        default=[],
        metavar="DIR",
        help="with --validate and one --engine-bench FILE: the measured sets of seed 0 and 1 (a run folder a "
        "variant, each with metrics.jsonl and summary.json) to fit the calibration on again (default: the "
        "committed fit)",
    )
    return p


def measured_cost(
    base: CostModel,
    params: float | None = None,
    engine_benches: list[str] | None = None,
    trainer_benches: list[str] | None = None,
) -> CostModel:
    """The cost model calibrated on our engine benchmark and, for the trainer's MFU, our trainer benchmark: on the
    files given, else on the committed measurements (`laminar.sim.measured`); a tensor-parallel replica's
    all-reduces on the committed `laminar bench tp` fit."""
    base = replace(base, tp_layer_latency_s=TP_LAYER_LATENCY_S)
    print(f"calibration: {TP_NOTE}")
    if engine_benches:
        for path in engine_benches:
            base, note = from_engine_bench(path, base)
            print(f"calibration: {note}")
    else:
        base = replace(base, decode_mem_eff=ENGINE_DECODE_MEM_EFF, step_overhead_s=0.0)
        print(f"calibration: {ENGINE_NOTE}")
    if params is not None:
        rows = trainer_rows(trainer_benches) if trainer_benches else TRAINER_ROWS
        base, note = from_trainer_rows(rows, base, params)
        print(f"calibration: {note}")
    return base


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.schedule_runs and not args.validate:
        raise SystemExit("laminar simulate: --schedule-runs is for --validate")
    if args.validate:
        from laminar.sim.validation import calibration_from_files, run_validation, table

        calibration = SMALL_GPU
        if args.schedule_runs or args.engine_bench:
            if len(args.engine_bench) != 1 or not args.schedule_runs:
                raise SystemExit(
                    "laminar simulate --validate: fitting again from files takes one --engine-bench FILE and "
                    "--schedule-runs SEED0_DIR SEED1_DIR"
                )
            try:
                calibration = calibration_from_files(args.engine_bench[0], args.schedule_runs)
            except (ValueError, OSError) as e:
                raise SystemExit(f"laminar simulate --validate: {e}") from None
        print(table(run_validation(Path(args.out), calibration)))
        return 0
    model = next((m for m in MODELS if args.model and m.lower() == args.model.lower()), args.model)
    names = SCHEDULES if args.schedule == "all" else tuple(args.schedule.split(","))
    try:
        cfg = load_config(args.config, gpus=args.gpus, model=model, steps=args.steps)
        for name in names:
            cfg.with_(schedule=name)  # every name is checked before anything runs
    except (ValueError, OSError) as e:
        raise SystemExit(f"laminar simulate: {e}") from None
    params = MODELS[cfg.model].params if cfg.model in MODELS else None
    cfg = cfg.with_(cost=measured_cost(cfg.cost, params, args.engine_bench, args.trainer_bench))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.bench:
        result = bench(cfg)
        (out / "bench.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
    elif args.plan:
        result = plan(cfg, args.workers)
        (out / "plan.json").write_text(json.dumps(result, indent=1))
        best = result["recommended"]
        print(
            f"{cfg.gpus} GPUs, {cfg.model}: trainer {best['trainer_gpus']} GPUs, "
            f"{best['rollout_replicas']} rollout replicas x TP{best['rollout_tp']} "
            f"({best['training_throughput']:,.0f} tokens/s simulated)"
        )
        for row in result["candidates"]:
            print(
                f"  trainer {row['trainer_gpus']:5d}  replicas {row['rollout_replicas']:5d}  "
                f"{row['training_throughput']:12,.0f} tok/s  trainer busy {row['trainer_busy']:.2f}"
            )
    elif args.paper:
        compare = (
            () if args.schedule == "all" else tuple(s for s in args.schedule.split(",") if s != "laminar")
        )
        paper_experiment(out, cfg, workers=args.workers, **({"compare": compare} if compare else {}))
        print((out / "speedup.md").read_text())
    else:
        summaries = run_many([cfg.with_(schedule=s) for s in names], args.workers)
        (out / "summary.json").write_text(json.dumps(summaries, indent=1))
        plot_runs(summaries, out / "schedules.png")
        for s in summaries:
            print(
                f"{s['schedule']:>20}: {s['training_throughput']:12,.0f} tok/s  step {s['step_time_s']:7.1f} s  "
                f"GPU busy {s['gpu_utilisation']:.2f}  staleness {s['staleness']['mean']:.2f}"
            )
        print(f"wrote {out / 'summary.json'} and {out / 'schedules.png'}")
    return 0
