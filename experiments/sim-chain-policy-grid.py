"""Laminar's dispatch and buffer policy on the chain task's lengths in the cluster simulator: how deep the buffer
runs ahead (`max_ahead_batches`, the runtime's `buffer.capacity_groups` over a step's groups), which complete
groups a step takes (`buffer.sampler`: fifo, the first completed, or oldest, the oldest version first) and the
staleness bound (`schedule.max_staleness`: 4 or none), against the best other schedule of the committed
`results/convergence-reasoning/sim-at-scale/` runs. Writes `policy-grid.json` and `policy-grid.md` there.

    python experiments/sim-chain-policy-grid.py [--workers 2]        (CPU, about five minutes with 2 processes)

The workload and cluster are those of `sim-at-scale` (`chain-lengths.yaml`: the chain runs' lengths as a
lognormal law, p99 7x the median, capped at 1024; the paper's batch of 512 prompts x 16, a quarter of the GPUs
training; the committed calibration, as `laminar simulate` applies it), 50 steps, for 0.5B and 7B models on 64, 256 and 1024 GPUs.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from laminar.sim.cli import measured_cost
from laminar.sim.config import load_config
from laminar.sim.cost import MODELS
from laminar.sim.experiment import run_many

HERE = Path(__file__).resolve().parents[1] / "results" / "convergence-reasoning" / "sim-at-scale"
CELLS = [(model, gpus) for model in ("0.5B", "7B") for gpus in (64, 256, 1024)]
AHEAD = (2.0, 3.0, 4.0)
SAMPLERS = ("fifo", "oldest")
BOUNDS = (4, None)  # schedule.max_staleness
DEFAULT = (3.0, "fifo", 4)


def best_other(model: str, gpus: int) -> tuple[str, float]:
    """The best non-Laminar schedule of the committed run of this cell: (name, training tokens/s)."""
    runs = json.loads((HERE / f"{model}-g{gpus}.json").read_text())
    best = max((r for r in runs if r["schedule"] != "laminar"), key=lambda r: r["training_throughput"])
    return best["schedule"], best["training_throughput"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    variants = list(itertools.product(AHEAD, SAMPLERS, BOUNDS))
    costs = {
        model: measured_cost(load_config(HERE / "chain-lengths.yaml").cost, MODELS[model].params)
        for model, _ in CELLS
    }
    cfgs, keys = [], []
    for (model, gpus), (ahead, sampler, bound) in itertools.product(CELLS, variants):
        base = load_config(HERE / "chain-lengths.yaml", gpus=gpus, model=model, steps=args.steps)
        base = base.with_(cost=costs[model])  # as `laminar simulate` calibrates it
        cfgs.append(
            base.with_(
                schedule={"name": "laminar", "max_staleness": bound},
                max_ahead_batches=ahead,
                sampler=sampler,
            )
        )
        keys.append((model, gpus, ahead, sampler, bound))
    summaries = run_many(cfgs, workers=args.workers)
    rows = []
    for (model, gpus, ahead, sampler, bound), s in zip(keys, summaries):
        other, other_tps = best_other(model, gpus)
        st = s["staleness"]
        rows.append(
            {
                "model": model,
                "gpus": gpus,
                "max_ahead_batches": ahead,
                "sampler": sampler,
                "max_staleness": bound,
                "training_throughput": round(s["training_throughput"]),
                "best_other": other,
                "over_best_other": round(s["training_throughput"] / other_tps, 3),
                "staleness_mean": round(st["mean"], 2),
                "staleness_p99": st["p99"],
                "staleness_max": st["max"],
                "rollout_idle": round(s["rollout_time"]["idle"], 3),
            }
        )
    (HERE / "policy-grid.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "| model | GPUs | ahead | sampler | max_staleness | tokens/s | over the best other | staleness mean / p99 / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = "**" if (r["max_ahead_batches"], r["sampler"], r["max_staleness"]) == DEFAULT else ""
        lines.append(
            f"| {r['model']} | {r['gpus']} | {mark}{r['max_ahead_batches']:g}{mark} | {r['sampler']} | "
            f"{r['max_staleness'] if r['max_staleness'] is not None else 'none'} | {r['training_throughput']:,} | "
            f"{r['over_best_other']:.2f}x ({r['best_other']}) | {r['staleness_mean']:.2f} / "
            f"{r['staleness_p99']} / {r['staleness_max']} |"
        )
    (HERE / "policy-grid.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
