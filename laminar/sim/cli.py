"""`laminar simulate`: run schedules on the simulated cluster, plan a layout, or reproduce the paper's grid."""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

from laminar.sim.calibrate import from_engine_bench, from_trainer_bench
from laminar.sim.config import SCHEDULES, load_config
from laminar.sim.cost import MODELS, CostModel
from laminar.sim.experiment import bench, paper_experiment, plan, run_many
from laminar.sim.plots import plot_runs


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laminar simulate", description=__doc__)
    p.add_argument("--config", help="YAML file of SimConfig fields (nested `lengths:` and `cost:`)")
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
    return p


def measured_cost(base: CostModel, params: float | None = None) -> CostModel:
    """Constants measured by our engine benchmark (results/engine-*.json) and, for the trainer's MFU, by the
    trainer benchmark (results/trainer/*/trainer.json), when they have been written."""
    for path in sorted(glob.glob("results/engine-*.json")):
        base, note = from_engine_bench(path, base)
        print(f"calibration: {note}")
    benches = sorted(glob.glob("results/trainer/*/trainer.json"))
    if params is not None and benches:
        base, note = from_trainer_bench(benches, base, params)
        print(f"calibration: {note}")
    return base


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.validate:
        from laminar.sim.validation import run_validation, table

        print(table(run_validation(Path(args.out))))
        return 0
    model = next((m for m in MODELS if args.model and m.lower() == args.model.lower()), args.model)
    names = SCHEDULES if args.schedule == "all" else tuple(args.schedule.split(","))
    try:
        cfg = load_config(args.config, gpus=args.gpus, model=model, steps=args.steps)
        for name in names:
            cfg.with_(schedule=name)  # every name is checked before anything runs
    except (ValueError, OSError) as e:
        raise SystemExit(f"laminar simulate: {e}") from None
    cfg = cfg.with_(cost=measured_cost(cfg.cost, MODELS[cfg.model].params if cfg.model in MODELS else None))
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
