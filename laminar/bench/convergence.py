"""`laminar bench convergence CONFIG`: the same real post-training job under several schedules and seeds, one run
after another in one process. The headline is time to accuracy: the wall time each schedule takes to reach
held-out accuracy targets, over seeds.

Seed S sets `task.seed` (a built-in task's training and held-out draws) and `run.seed` (prompt order, sampling,
the trainer's initial randomness) of every schedule's run. All schedules of a seed run before the next seed, so a
cut benchmark keeps whole comparisons. Wall time counts from each run's first dispatched prompt (model loading,
engine warm-up and Ray start are excluded); an evaluation's time is when the weights it scored were published.

Per schedule and seed:
- time to target: the wall time of the first evaluation at or above each target accuracy (None: never reached);
- accuracy at equal wall time: at the shortest last-evaluation time over all runs and at 1/4, 1/2 and 3/4 of it,
  each the accuracy of the last evaluation at or before that time;
- accuracy at equal trainer steps: at the versions (trainer steps) that every run evaluated;
- response length over trainer steps: p50, p90, p99 and max of each step's trained responses (the trainer's step
  metrics), the tail a step waits for.
Over seeds, per schedule and target: the time to it by seed, and its mean, standard deviation, smallest and
largest over the seeds that reached it. Per pair of schedules: the other's time over this one's (above 1: this
one is faster), over the seeds where both reached the target, as the ratio of the means and the mean of the
per-seed ratios; the headline compares the first schedule with the fastest other.

Writes `DIR/convergence.json`, `.md` and `.png` after every run. The runs' folders are `DIR/runs/SCHEDULE/seed-S`
(metrics, summary, plots, checkpoints: not for git). `--report DIR` rebuilds the three files from those folders
without training (a device run's folders brought back); a folder `DIR/runs/SCHEDULE` of the older layout (one
run, its `metrics.jsonl` directly inside) counts as seed 0. A benchmark, never a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from laminar.bench.convergence_report import Runs, find_runs, write_report

SCHEDULES = "laminar,sync,one_step"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="laminar bench convergence", description=__doc__)
    ap.add_argument("config", nargs="?", help="YAML config of the job (model, task, eval, trainer, rollout)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    ap.add_argument("--schedules", default=SCHEDULES, help="run in this order; the first is the headline's")
    ap.add_argument(
        "--seeds", default="0", help="comma-separated; seed S sets task.seed and run.seed of its runs"
    )
    ap.add_argument(
        "--targets", help="accuracies whose first wall time is reported (default 0.5, or what DIR reported)"
    )
    ap.add_argument(
        "--variant",
        action="append",
        metavar="NAME=OVERRIDES",
        help="instead of schedules: a run named NAME with these space-separated overrides (repeat for each; "
        "e.g. --variant 'gspo=trainer.ratio=sequence trainer.loss_agg=seq_mean_token_mean')",
    )
    ap.add_argument("--out", default="runs/convergence")
    ap.add_argument("--report", metavar="DIR", help="rebuild DIR's report from DIR/runs without training")
    args = ap.parse_args(argv)
    command = "laminar bench convergence " + " ".join(argv or [])
    try:
        variants = dict(parse_variant(v) for v in args.variant or [])
    except ValueError as e:
        ap.error(str(e))
    order = list(variants) if variants else args.schedules.split(",")
    try:
        targets = [float(x) for x in args.targets.split(",")] if args.targets else None
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        ap.error(
            f"--targets {args.targets!r} or --seeds {args.seeds!r}: give comma-separated numbers (seeds whole)"
        )

    if args.report:
        if args.config:
            ap.error("--report rebuilds from run folders and takes no CONFIG or overrides")
        out = Path(args.report)
        runs = find_runs(out, order)
        if not runs:
            ap.error(
                f"{out / 'runs'} holds no run folders (SCHEDULE/seed-S/metrics.jsonl or SCHEDULE/metrics.jsonl)"
            )
        old = out / "convergence.json"
        meta = (
            json.loads(old.read_text())["meta"]
            if old.is_file()
            else {"machine": "not recorded", "command": ""}
        )
        meta = {**meta, "targets": targets or meta.get("targets", [0.5]), "report": command}
        print(write_report(out, runs, meta["targets"], meta), end="")
        return 0

    if not args.config:
        ap.error("give the job's CONFIG (or --report DIR to rebuild a report)")
    from laminar.bench.schedules import card
    from laminar.configure import load_config
    from laminar.train import train

    out = Path(args.out)
    meta = {"machine": card(), "command": command, "targets": targets or [0.5], "seeds": seeds}
    runs: Runs = {}
    md = ""
    for seed in seeds:
        for name in order:
            run_dir = out / "runs" / name / f"seed-{seed}"
            shutil.rmtree(run_dir, ignore_errors=True)
            what = variants[name] if variants else [f"schedule.name={name}"]
            seeded = [f"task.seed={seed}", f"run.seed={seed}", *what, f"run.out={run_dir}"]
            train(load_config(args.config, [*args.overrides, *seeded]), run_dir)
            runs.setdefault(name, {})[seed] = run_dir
            md = write_report(out, runs, meta["targets"], meta)  # after each: a cut benchmark keeps what ran
    print(md, end="")
    return 0


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`NAME=OVERRIDES` (`--variant`): the run's name and its space-separated dotted overrides."""
    name, sep, rest = text.partition("=")
    if not sep or not name or "/" in name or "." in name:
        raise ValueError(
            f"--variant {text!r}: expected NAME=OVERRIDES, a plain name then space-separated overrides, "
            "e.g. 'drgrpo=trainer.advantage=drgrpo trainer.loss_agg=seq_mean_token_sum_norm'"
        )
    return name, rest.split()


if __name__ == "__main__":
    raise SystemExit(main())
