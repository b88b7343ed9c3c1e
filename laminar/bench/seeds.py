"""`laminar bench seeds NAME=DIR[,DIR...] ... --out OUT`: one table over several seeds of `laminar bench schedules`.

A schedule benchmark on a long-tailed workload varies from seed to seed (a step waits for the slowest of its
groups, and a short run samples few of them), so a ratio from one seed says little. Each argument names one
seed and the benchmark folders that ran it (several when its schedules ran in separate device calls); every
folder holds a `schedules.json`. Writes OUT/seeds.json and OUT/seeds.md: each schedule's training tokens/s by
seed, their mean, and its ratio to the reference schedule three ways: per seed, the ratio of the means and the
mean of the ratios, with the smallest and largest.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

METRIC = "train_tokens_per_s"


def parse_seed(arg: str) -> tuple[str, list[Path]]:
    name, sep, dirs = arg.partition("=")
    if not sep or not name or not dirs:
        raise ValueError(
            f"{arg!r}: give NAME=DIR[,DIR...] (a seed's name and the benchmark folders that ran it)"
        )
    return name, [Path(d) for d in dirs.split(",")]


def load_seed(dirs: list[Path]) -> dict[str, dict[str, Any]]:
    """Every schedule a seed's folders hold, by label; a label in two folders is an error (which one counts?)."""
    runs: dict[str, dict[str, Any]] = {}
    for d in dirs:
        path = d / "schedules.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: no schedules.json (give folders that `laminar bench schedules` wrote)"
            )
        for r in json.loads(path.read_text())["results"]:
            label = r.get("label", r.get("schedule"))
            if label in runs:
                raise ValueError(
                    f"{label!r} is in two folders of one seed ({path}); give each schedule once a seed"
                )
            runs[label] = r
    return runs


def ratios(values: dict[Any, float], reference: dict[Any, float]) -> dict[str, Any]:
    """`values` over `reference`, over the seeds both have: the ratio by seed, then the ratio of the means and the
    mean of the ratios (they differ when seeds differ in scale: the first weighs the larger seeds more), the
    smallest and the largest; None where no seed has both."""
    by_seed = {s: values[s] / reference[s] for s in values if s in reference}
    both = list(by_seed)
    return {
        "ratio_by_seed": by_seed,
        "ratio_of_means": (
            statistics.mean(values[s] for s in both) / statistics.mean(reference[s] for s in both)
            if both
            else None
        ),
        "mean_of_ratios": statistics.mean(by_seed.values()) if both else None,
        "ratio_min": min(by_seed.values()) if both else None,
        "ratio_max": max(by_seed.values()) if both else None,
    }


def combine(seeds: dict[str, dict[str, dict[str, Any]]], reference: str) -> list[dict[str, Any]]:
    """Per schedule: tokens/s by seed, the mean, and the ratios to `reference` over the seeds both ran."""
    labels = list(dict.fromkeys(label for runs in seeds.values() for label in runs))
    if not any(reference in runs for runs in seeds.values()):
        raise ValueError(f"the reference schedule {reference!r} is in no seed; the schedules are {labels}")
    of_reference = {s: runs[reference][METRIC] for s, runs in seeds.items() if reference in runs}
    rows = []
    for label in labels:
        by_seed = {s: runs[label][METRIC] for s, runs in seeds.items() if label in runs}
        p99 = [runs[label]["staleness"]["p99"] for runs in seeds.values() if label in runs]
        rows.append(
            {
                "label": label,
                "tokens_per_s": by_seed,
                "mean": statistics.mean(by_seed.values()),
                **ratios(by_seed, of_reference),
                "staleness_p99_max": max(p99),
            }
        )
    return rows


def table(rows: list[dict[str, Any]], seeds: list[str], reference: str) -> str:
    head = " | ".join(f"{s} tok/s" for s in seeds)
    lines = [
        f"| schedule | {head} | mean | / {reference} by seed | ratio of means | mean of ratios | staleness p99 (max) |",
        "|---|" + "---|" * (len(seeds) + 5),
    ]
    for r in rows:
        cells = " | ".join(f"{r['tokens_per_s'][s]:,.0f}" if s in r["tokens_per_s"] else "" for s in seeds)
        by_seed = ", ".join(f"{r['ratio_by_seed'][s]:.2f}x" for s in seeds if s in r["ratio_by_seed"])
        of_means = f"{r['ratio_of_means']:.2f}x" if r["ratio_of_means"] is not None else ""
        of_ratios = f"{r['mean_of_ratios']:.2f}x" if r["mean_of_ratios"] is not None else ""
        lines.append(
            f"| {r['label']} | {cells} | {r['mean']:,.0f} | {by_seed} | {of_means} | {of_ratios} | "
            f"{r['staleness_p99_max']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="laminar bench seeds", description=__doc__)
    ap.add_argument(
        "seeds", nargs="+", help="NAME=DIR[,DIR...]: a seed and the benchmark folders that ran it"
    )
    ap.add_argument("--out", required=True, help="folder for seeds.json and seeds.md")
    ap.add_argument("--reference", default="sync", help="the schedule the ratios are to (default: sync)")
    args = ap.parse_args(argv)
    try:
        parsed = [parse_seed(a) for a in args.seeds]
        names = [n for n, _ in parsed]
        if len(set(names)) != len(names):
            raise ValueError(f"seed names repeat: {names}; give each seed once")
        seeds = {name: load_seed(dirs) for name, dirs in parsed}
        rows = combine(seeds, args.reference)
    except (ValueError, FileNotFoundError) as e:
        ap.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sources = {name: [str(d) for d in dirs] for name, dirs in parsed}
    (out / "seeds.json").write_text(
        json.dumps({"reference": args.reference, "seeds": sources, "schedules": rows}, indent=1) + "\n"
    )
    md = (
        f"# Schedules over {len(seeds)} seeds\n\n`laminar bench seeds {' '.join(args.seeds)} --out {args.out}"
        + (f" --reference {args.reference}" if args.reference != "sync" else "")
        + "`\n\n"
        + table(rows, names, args.reference)
    )
    (out / "seeds.md").write_text(md)
    print(md, end="")
    return 0
