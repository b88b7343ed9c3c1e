"""The report of `laminar bench convergence` (`convergence.py` runs the jobs): each run's held-out accuracy curve
read from its folder, time to each target, accuracy at equal wall time and at equal trainer steps, the
comparison over seeds and between schedules, written as `convergence.json`, `.md` and `.png`."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from laminar.bench.seeds import ratios  # noqa: E402
from laminar.jsonio import write_json  # noqa: E402
from laminar.telemetry.audit import read_jsonl  # noqa: E402

FRACTIONS = (0.25, 0.5, 0.75, 1.0)  # of the shortest run's last evaluation time: the equal-wall-time points
LENGTHS = (
    "response_len_mean",
    "response_len_p50",
    "response_len_p90",
    "response_len_p99",
    "response_len_max",
)
MAX_VERSION_COLUMNS = 6  # of the versions every run evaluated, the table shows this many, evenly spread

Runs = dict[str, dict[int, Path]]  # schedule -> seed -> run folder


def find_runs(out: Path, order: list[str]) -> Runs:
    """The run folders under `out/runs`, the schedules of `order` first (in its order), then any others."""
    found: Runs = {}
    for folder in sorted(p for p in (out / "runs").glob("*") if p.is_dir()):
        seeds = {
            int(d.name.removeprefix("seed-")): d
            for d in folder.glob("seed-*")
            if d.name.removeprefix("seed-").isdigit() and (d / "metrics.jsonl").is_file()
        }
        if not seeds and (folder / "metrics.jsonl").is_file():  # the older layout: one run, seed 0
            seeds = {0: folder}
        if seeds:
            found[folder.name] = dict(sorted(seeds.items()))
    names = [n for n in order if n in found] + [n for n in found if n not in order]
    return {n: found[n] for n in names}


def curve(run_dir: Path) -> dict[str, Any]:
    """One run from its folder: evaluations and trainer steps, timed from its first dispatch, and its summary's
    wall time, steps, staleness and audit."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    first = min((r["t"] for r in records if r["kind"] == "dispatch"), default=0.0)
    evals = sorted((r for r in records if r["kind"] == "eval"), key=lambda r: r["version"])
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    return {
        "run_dir": str(run_dir),
        "evals": [
            {
                "version": r["version"],
                "wall_s": round(max(r["t_version"] - first, 0.0), 3),
                "accuracy": r["accuracy"],
                "response_len_mean": r.get("response_len_mean"),
            }
            for r in evals
        ],
        "steps": [
            {
                "step": r["step"],
                "wall_s": round(r["t"] - first, 3),
                "reward_mean": r.get("reward_mean"),
                **{k: r.get(k) for k in LENGTHS},  # None in runs from before the trainer reported percentiles
            }
            for r in records
            if r["kind"] == "step"
        ],
        "summary": {
            **{k: summary.get(k) for k in ("wall_s", "trainer_steps", "staleness")},
            "audit_ok": summary.get("trajectories", {}).get("audit_ok"),
        },
    }


def time_to(evals: list[dict[str, Any]], target: float) -> float | None:
    """Wall time of the first evaluation at or above `target`; None if none reached it."""
    return next((e["wall_s"] for e in evals if e["accuracy"] >= target), None)


def accuracy_at(evals: list[dict[str, Any]], wall_s: float) -> float | None:
    """Accuracy of the last evaluation at or before `wall_s` (what the run had shown by then); None if none."""
    before = [e for e in evals if e["wall_s"] <= wall_s]
    return max(before, key=lambda e: (e["wall_s"], e["version"]))["accuracy"] if before else None


def accuracy_at_version(evals: list[dict[str, Any]], version: int) -> float | None:
    return next((e["accuracy"] for e in evals if e["version"] == version), None)


def equal_times(curves: list[dict[str, Any]]) -> list[float]:
    """The equal-wall-time points: fractions of the shortest last-evaluation time over runs that evaluated."""
    last = [c["evals"][-1]["wall_s"] for c in curves if c["evals"]]
    return [round(min(last) * f, 3) for f in FRACTIONS] if last else []


def equal_versions(curves: list[dict[str, Any]]) -> list[int]:
    """The versions every run evaluated."""
    common = set.intersection(*({e["version"] for e in c["evals"]} for c in curves)) if curves else set()
    return sorted(common)


def spread(values: list[float]) -> dict[str, Any]:
    """Mean, sample standard deviation (None below two values), smallest and largest; all None if empty."""
    if not values:
        return {"mean": None, "sd": None, "min": None, "max": None}
    sd = statistics.stdev(values) if len(values) > 1 else None
    return {"mean": statistics.mean(values), "sd": sd, "min": min(values), "max": max(values)}


def over_seeds(results: dict[str, dict[int, dict[str, Any]]], targets: list[float]) -> dict[str, Any]:
    """Per schedule and target: time to it by seed, how many seeds reached it, and the spread over those."""
    out: dict[str, Any] = {}
    for name, by_seed in results.items():
        out[name] = {}
        for x in targets:
            times = {s: r["time_to_target_s"][str(x)] for s, r in by_seed.items()}
            reached = [t for t in times.values() if t is not None]
            out[name][str(x)] = {
                "by_seed": times,
                "reached": len(reached),
                "seeds": len(times),
                **spread(reached),
            }
    return out


def reached(entry: dict[str, Any]) -> dict[int, float]:
    """Of one schedule's `over_seeds` entry for a target: the time to it by seed, of the seeds that reached it."""
    return {s: t for s, t in entry["by_seed"].items() if t is not None}


def versus(summary: dict[str, Any], targets: list[float]) -> list[dict[str, Any]]:
    """Each ordered pair of schedules and target: the other's time over this one's (above 1: this one reached the
    target sooner), per seed where both reached it, as the ratio of the means and the mean of the ratios."""
    return [
        {
            "target": x,
            "schedule": name,
            "other": other,
            **ratios(reached(summary[other][str(x)]), reached(summary[name][str(x)])),
        }
        for x in targets
        for name in summary
        for other in summary
        if other != name
    ]


def headline(summary: dict[str, Any], targets: list[float]) -> list[dict[str, Any]]:
    """Per target: the first schedule against the fastest other (the most seeds reached, then the smallest mean
    time), as in `versus`; `fastest_other` None where no other reached it."""
    if len(summary) < 2:
        return []
    first, *others = summary
    rows = []
    for x in targets:
        of = {name: summary[name][str(x)] for name in summary}
        best = min(
            (o for o in others if of[o]["reached"]),
            key=lambda o: (-of[o]["reached"], of[o]["mean"]),
            default=None,
        )
        compared = ratios(reached(of[best]), reached(of[first])) if best else {}
        rows.append({"target": x, "schedule": first, "fastest_other": best, **compared})
    return rows


def build(runs: Runs, targets: list[float]) -> dict[str, Any]:
    """Everything `convergence.json` holds but its meta, from the run folders."""
    results = {name: {s: curve(d) for s, d in by_seed.items()} for name, by_seed in runs.items()}
    curves = [c for by_seed in results.values() for c in by_seed.values()]
    times, versions = equal_times(curves), equal_versions(curves)
    for c in curves:
        c["time_to_target_s"] = {str(x): time_to(c["evals"], x) for x in targets}
        c["accuracy_at_wall_s"] = [accuracy_at(c["evals"], t) for t in times]
        c["accuracy_at_versions"] = [accuracy_at_version(c["evals"], v) for v in versions]
    summary = over_seeds(results, targets)
    pairs = versus(summary, targets)
    return {
        "equal_wall_s": times,
        "equal_versions": versions,
        "over_seeds": summary,
        "versus": pairs,
        "headline": headline(summary, targets),
        "results": results,
    }


def write_report(out: Path, runs: Runs, targets: list[float], meta: dict[str, Any]) -> str:
    """convergence.json, .md and .png in `out`; returns the markdown."""
    report = build(runs, targets)
    write_json(out / "convergence.json", {"meta": meta, **report})
    md = markdown(report, targets, meta)
    (out / "convergence.md").write_text(md)
    plot(report, targets, out / "convergence.png", meta)
    return md


def _num(x: float | None, fmt: str = ".1f") -> str:
    return "–" if x is None else format(x, fmt)


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}x"


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.mean(present) if present else None


def _evenly(items: list[Any], k: int) -> list[Any]:
    """At most `k` of `items`, evenly spread, the first and last included."""
    if len(items) <= k:
        return items
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def markdown(report: dict[str, Any], targets: list[float], meta: dict[str, Any]) -> str:
    results, summary = report["results"], report["over_seeds"]
    n_seeds = len({s for by_seed in results.values() for s in by_seed})
    lines = [
        f"# Time to accuracy: {', '.join(results)} over {n_seeds} seed{'s' if n_seeds > 1 else ''}",
        "",
        f"Machine: {meta.get('machine')}."
        + (f" Command: `{meta['command']}`." if meta.get("command") else "")
        + (f" Report rebuilt by `{meta['report']}`." if meta.get("report") else ""),
        "Wall time counts from each run's first dispatched prompt; an evaluation's time is when the weights it "
        "scored were published.",
        "",
    ]
    for h in report["headline"]:
        x, name, other = h["target"], h["schedule"], h["fastest_other"]
        mine = summary[name][str(x)]
        if not mine["reached"] or other is None:
            said = f"{name} never reached it" if not mine["reached"] else "no other schedule reached it"
            lines.append(f"- **{x:g}**: {said}.")
            continue
        theirs = summary[other][str(x)]
        lines.append(
            f"- **{x:g}**: {name} reached it in {mine['reached']}/{mine['seeds']} seeds, mean {_num(mine['mean'])} s; "
            f"the fastest other, {other} ({theirs['reached']}/{theirs['seeds']}), mean {_num(theirs['mean'])} s. "
            f"{other}'s time over {name}'s: {_ratio(h.get('ratio_of_means'))} (ratio of means), "
            f"{_ratio(h.get('mean_of_ratios'))} (mean of per-seed ratios, "
            f"{_ratio(h.get('ratio_min'))} to {_ratio(h.get('ratio_max'))})."
        )

    lines += ["", "## Time to target (s), per run", ""]
    rows = []
    for name, by_seed in results.items():
        for s, r in by_seed.items():
            acc = [e["accuracy"] for e in r["evals"]]
            firsts = [_num(r["time_to_target_s"][str(x)]) for x in targets]
            accs = [_num(a, ".3f") for a in (acc[0], max(acc), acc[-1])] if acc else ["–"] * 3
            rows.append([name, str(s), str(len(r["steps"])), *accs, *firsts])
    head = [
        "schedule",
        "seed",
        "steps",
        "first acc",
        "best acc",
        "last acc",
        *(f"time to {x:g}" for x in targets),
    ]
    lines += _table(head, rows)

    lines += ["", "## Over seeds: time to target (s) over the seeds that reached it", ""]
    rows = []
    for name, by_target in summary.items():
        for x in targets:
            t = by_target[str(x)]
            row = [name, f"{x:g}", f"{t['reached']}/{t['seeds']}"]
            rows.append(row + [_num(t[k]) for k in ("mean", "sd", "min", "max")])
    lines += _table(["schedule", "target", "reached", "mean", "sd", "min", "max"], rows)

    lines += [
        "",
        "## Versus each other: the other's time over this one's (above 1: this one is faster)",
        "",
        "Over the seeds where both reached the target; pairs with none left out.",
        "",
    ]
    rows = [
        [
            f"{p['target']:g}",
            p["schedule"],
            p["other"],
            ", ".join(f"{s}: {_ratio(v)}" for s, v in p["ratio_by_seed"].items()) or "–",
            _ratio(p["ratio_of_means"]),
            _ratio(p["mean_of_ratios"]),
        ]
        for p in report["versus"]
        if p["ratio_by_seed"]
    ]
    lines += _table(["target", "schedule", "other", "by seed", "ratio of means", "mean of ratios"], rows)

    def by_run(title: str, columns: list[str], key: str, keep: list[int]) -> list[str]:
        rows = []
        for name, by_seed in results.items():
            for s, r in by_seed.items():
                rows.append([name, str(s), *(_num(r[key][i], ".3f") for i in keep)])
            if len(by_seed) > 1:
                means = [_mean([r[key][i] for r in by_seed.values()]) for i in keep]
                rows.append([name, "mean", *(_num(m, ".3f") for m in means)])
        return ["", title, "", *_table(["schedule", "seed", *columns], rows)]

    times = report["equal_wall_s"]
    lines += by_run(
        "## Accuracy at equal wall time (the last evaluation at or before it)",
        [f"{t:.1f} s" for t in times],
        "accuracy_at_wall_s",
        list(range(len(times))),
    )
    versions = report["equal_versions"]
    keep = _evenly(list(range(len(versions))), MAX_VERSION_COLUMNS)
    lines += by_run(
        "## Accuracy at equal trainer steps (versions every run evaluated)",
        [f"step {versions[i]}" for i in keep],
        "accuracy_at_versions",
        keep,
    )

    lines += ["", "## Response length (tokens) of the trained responses: p50 / p99 / max", ""]
    rows = []
    for name, by_seed in results.items():
        for s, r in by_seed.items():
            steps = r["steps"]
            picked = [steps[0], steps[len(steps) // 2], steps[-1]] if steps else []
            cells = [
                " / ".join(_num(st[f"response_len_{q}"], ".0f") for q in ("p50", "p99", "max"))
                + f" (step {st['step']})"
                for st in picked
            ]
            rows.append([name, str(s), *(cells or ["–"] * 3)])
    lines += _table(["schedule", "seed", "first step", "middle step", "last step"], rows)
    return "\n".join(lines) + "\n"


def mean_curve(evals_by_seed: list[list[dict[str, Any]]]) -> tuple[list[float], list[float]]:
    """The mean over seeds of `accuracy_at`, at every seed's evaluation times up to the shortest seed's last one
    (a step function: each seed holds its last evaluation until its next)."""
    if not all(evals_by_seed):
        return [], []
    horizon = min(evals[-1]["wall_s"] for evals in evals_by_seed)
    grid = sorted({e["wall_s"] for evals in evals_by_seed for e in evals if e["wall_s"] <= horizon})
    points = [(t, [accuracy_at(evals, t) for evals in evals_by_seed]) for t in grid]
    kept = [(t, statistics.mean(accs)) for t, accs in points if None not in accs]
    return [t for t, _ in kept], [a for _, a in kept]


def plot(report: dict[str, Any], targets: list[float], path: Path, meta: dict[str, Any]) -> None:
    fig, (acc, lens) = plt.subplots(1, 2, figsize=(13, 4.5))
    any_lengths = False
    for i, (name, by_seed) in enumerate(report["results"].items()):
        colour = f"C{i}"
        runs = list(by_seed.values())
        # a run shows its last evaluation until the next: steps, as `accuracy_at` reads them
        thin = len(runs) > 1
        for r in runs:
            t, a = [e["wall_s"] for e in r["evals"]], [e["accuracy"] for e in r["evals"]]
            style = (
                {"lw": 0.7, "alpha": 0.45, "marker": "."} if thin else {"lw": 2, "marker": "o", "label": name}
            )
            acc.plot(t, a, color=colour, drawstyle="steps-post", **style)
        if thin:
            t, mean = mean_curve([r["evals"] for r in runs])
            label = f"{name} (mean of {len(runs)} seeds)"
            acc.plot(t, mean, color=colour, lw=2.5, drawstyle="steps-post", label=label)
        for j, r in enumerate(runs):
            steps = [st for st in r["steps"] if st["response_len_p50"] is not None]
            any_lengths |= bool(steps)
            x = [st["step"] for st in steps]
            label = name if j == 0 else None
            lens.plot(x, [st["response_len_p50"] for st in steps], "-", color=colour, lw=1.2, label=label)
            lens.plot(x, [st["response_len_p99"] for st in steps], "--", color=colour, lw=1.2)
    for x in targets:
        acc.axhline(x, color="grey", lw=0.8, ls=":")
    acc.set(
        xlabel="wall time since the first dispatched prompt (s)",
        ylabel="held-out accuracy",
        title=f"Held-out accuracy over wall time ({meta.get('machine')})",
        ylim=(0, 1),
    )
    acc.legend()
    lens.set(
        xlabel="trainer step",
        ylabel="response length (tokens)",
        title="Trained response length: p50 (solid), p99 (dashed)",
    )
    if any_lengths:
        lens.legend()
    else:
        lens.text(
            0.5, 0.5, "no response-length percentiles in these runs", ha="center", transform=lens.transAxes
        )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
