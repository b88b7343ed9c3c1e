"""`laminar bench convergence CONFIG`: the same real post-training job (model, task, seeds, steps) under several
schedules, one after another in one process, and held-out accuracy over wall time for each.

Wall time counts from each run's first dispatched prompt (model loading, engine warm-up and Ray start are
excluded, as they are for a single-process loop); an evaluation's time is when the weights it scored were
published. Writes `DIR/convergence.json`, `DIR/convergence.md` and `DIR/convergence.png`; each run's folder
(metrics, summary, plots) is under `DIR/runs/SCHEDULE` and is not meant for git (checkpoints).
A benchmark, never a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from laminar.bench.schedules import card  # noqa: E402
from laminar.config import load_config  # noqa: E402
from laminar.jsonio import write_json  # noqa: E402


def curve(run_dir: Path) -> dict[str, Any]:
    """Evaluations of one run, timed from its first dispatch, and its step times."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = min((r["t"] for r in records if r["kind"] == "dispatch"), default=0.0)
    evals = sorted((r for r in records if r["kind"] == "eval"), key=lambda r: r["version"])
    steps = [r for r in records if r["kind"] == "step"]
    return {
        "t_first_dispatch": first,
        "evals": [
            {
                "version": r["version"],
                "wall_s": round(max(r["t_version"] - first, 0.0), 3),
                "accuracy": r["accuracy"],
                "response_len_mean": r["response_len_mean"],
            }
            for r in evals
        ],
        "steps": len(steps),
        "wall_s_last_step": round(steps[-1]["t"] - first, 3) if steps else None,
        "reward_mean_first_last": [steps[0]["reward_mean"], steps[-1]["reward_mean"]] if steps else None,
    }


def time_to(evals: list[dict[str, Any]], target: float) -> float | None:
    return next((e["wall_s"] for e in evals if e["accuracy"] >= target), None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="laminar bench convergence", description=__doc__)
    ap.add_argument("config", help="YAML config of the job (model, task, eval, trainer, rollout)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides applied to every schedule")
    ap.add_argument("--schedules", default="laminar,sync,one_step")
    ap.add_argument("--targets", default="0.5", help="accuracies whose first wall time is reported")
    ap.add_argument("--out", default="runs/convergence")
    args = ap.parse_args(argv)
    from laminar.train import train

    out = Path(args.out)
    targets = [float(x) for x in args.targets.split(",")]
    results: dict[str, Any] = {}
    meta = {
        "machine": card(),
        "command": "laminar bench convergence " + " ".join(argv or []),
        "targets": targets,
    }
    for name in args.schedules.split(","):
        run_dir = out / "runs" / name
        shutil.rmtree(run_dir, ignore_errors=True)
        cfg = load_config(args.config, [*args.overrides, f"schedule.name={name}", f"run.out={run_dir}"])
        t = time.time()
        summary = train(cfg, run_dir)
        results[name] = {
            **curve(run_dir),
            "run_wall_s": round(time.time() - t, 1),
            "summary": {k: summary.get(k) for k in ("wall_s", "trainer_steps", "staleness", "eval")},
        }
        results[name]["time_to_target_s"] = {str(x): time_to(results[name]["evals"], x) for x in targets}
        write_json(
            out / "convergence.json", {"meta": meta, "results": results}
        )  # after each: a cut run keeps it
    (out / "convergence.md").write_text(table(results, targets, meta))
    plot(results, targets, out / "convergence.png", meta)
    print(table(results, targets, meta))
    return 0


def table(results: dict[str, Any], targets: list[float], meta: dict[str, Any]) -> str:
    head = "| schedule | steps | first acc | best acc | last acc | " + " | ".join(
        f"time to {x:.0%} (s)" for x in targets
    )
    lines = [f"Machine: {meta['machine']}. Command: `{meta['command']}`.", "", head + " |"]
    lines.append("|---" * (5 + len(targets)) + "|")
    for name, r in results.items():
        acc = [e["accuracy"] for e in r["evals"]] or [float("nan")]
        cells = [f"{r['time_to_target_s'][str(x)]}" for x in targets]
        lines.append(
            f"| {name} | {r['steps']} | {acc[0]:.3f} | {max(acc):.3f} | {acc[-1]:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], targets: list[float], path: Path, meta: dict[str, Any]) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in results.items():
        ax.plot([e["wall_s"] for e in r["evals"]], [e["accuracy"] for e in r["evals"]], "o-", label=name)
    for x in targets:
        ax.axhline(x, color="grey", lw=0.8, ls=":")
    ax.set(
        xlabel="wall time since the first dispatched prompt (s)",
        ylabel="held-out accuracy (greedy)",
        title=f"Held-out accuracy over wall time ({meta['machine']})",
        ylim=(0, 1),
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
