"""`laminar bench schedules`: every schedule on the same length-controlled workload, the same parts, the same
machine and the same number of trainer steps, one after another in one process; a table of ratios to `sync`.

Writes `DIR/schedules.json`, `DIR/schedules.md` and plots (throughput bars, per-replica busy/idle timelines,
staleness histograms). A benchmark, never a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from laminar.configure import load_config  # noqa: E402
from laminar.telemetry.provenance import code_digest

# (label, schedule, extra overrides): the four baselines, Laminar, its two ablations and two repack variants
VARIANTS = [
    ("sync", "sync", []),
    ("one_step", "one_step", []),
    ("stream", "stream", []),
    ("partial", "partial", []),
    ("laminar", "laminar", []),
    ("laminar-norepack", "laminar", ["repack.enabled=false"]),
    ("laminar-globalpush", "laminar", ["schedule.global_push=true"]),
    ("laminar-movekv", "laminar", ["repack.move_kv=true"]),
    ("laminar-rampdown", "laminar", ["repack.ramp_down_frac=0.5"]),
]

CPU_DEFAULTS = [
    "task.name=lengths",
    "task.length_median=10",
    "task.length_p99_ratio=10",
    "rollout.max_new_tokens=96",
    "rollout.replicas=3",
    "rollout.groups_per_batch=2",
    "trainer.groups_per_step=4",
    "trainer.group_size=4",
    "trainer.steps=30",
    "trainer.warmup_steps=3",
    "repack.batch_limit_b=64",  # B on this CPU for the demo model (results/engine/engine-cpu.json)
    "buffer.capacity_groups=12",
    "schedule.staleness=2",
]


def card() -> str:
    """What ran the numbers: the GPUs if any, else the processor."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return f"CPU ({platform.processor() or platform.machine()})"


def utilisation(records: list[dict[str, Any]], wall: float) -> dict[str, float]:
    """Busy decode time over wall time, and the mean running batch while busy, averaged over replicas."""
    last: dict[int, dict[str, Any]] = {}
    running = defaultdict(list)
    for r in records:
        if r["kind"] == "replica":
            last[r["replica"]] = r
            if r["running"] > 0:
                running[r["replica"]].append(r["running"])
    if not last:
        return {"busy": 0.0, "mean_running": 0.0}
    busy = sum(r["busy_s"] for r in last.values()) / (len(last) * wall)
    mean_running = sum(sum(v) / len(v) for v in running.values() if v) / max(len(running), 1)
    return {"busy": round(busy, 4), "mean_running": round(mean_running, 2), **tool_waits(records)}


def tool_waits(records: list[dict[str, Any]]) -> dict[str, float]:
    """How the replicas waited on tools, time-weighted over their progress records (each record holds until the
    next): `tool_wait_share`, the share of time a replica had work but all of it was parked on tool calls
    (nothing to decode); `parked_share`, the mean share of a replica's requests parked on a call while it had
    any; `kv_used`, the mean share of KV blocks held while it had work (parked requests keep theirs)."""
    by_rep = defaultdict(list)
    for r in records:
        if r["kind"] == "replica":
            by_rep[r["replica"]].append(r)
    span = waiting = work = parked = kv = 0.0
    for rows in by_rep.values():
        for a, b in zip(rows, rows[1:]):
            dt = b["t"] - a["t"]
            held = a["running"] + a.get("waiting", 0) + a.get("parked", 0)
            span += dt
            if held == 0:
                continue
            work += dt
            waiting += dt * (a["running"] + a.get("waiting", 0) == 0)
            parked += dt * a.get("parked", 0) / held
            kv += dt * a["kv_blocks_used"] / a["kv_blocks_total"] if a.get("kv_blocks_total") else 0.0
    return {
        "tool_wait_share": round(waiting / span, 4) if span else 0.0,
        "parked_share": round(parked / work, 4) if work else 0.0,
        "kv_used": round(kv / work, 4) if work else 0.0,
    }


def run_variant(
    label: str, schedule: str, overrides: list[str], out: Path, config: str | None = None
) -> dict[str, Any]:
    from laminar.train import train

    cfg = load_config(config, [*overrides, f"schedule.name={schedule}", f"run.out={out / label}"])
    shutil.rmtree(
        out / label, ignore_errors=True
    )  # metrics.jsonl appends: an earlier run's records would mix in
    t = time.time()
    train(cfg, out / label, quiet=True)
    summary = collect(label, out / label)
    print(
        f"{label:>20}: train {summary['train_tokens_per_s']:8.1f} tok/s  gen {summary['gen_tokens_per_s']:8.1f}"
        f" tok/s  staleness p99 {summary['staleness']['p99']:.0f}  ({time.time() - t:.0f}s)",
        flush=True,
    )
    return summary


def collect(label: str, folder: Path) -> dict[str, Any]:
    """One variant's row of the comparison, from its run folder (`summary.json` and `metrics.jsonl`)."""
    summary = json.loads((folder / "summary.json").read_text())
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    summary["label"] = label
    summary["utilisation"] = utilisation(records, summary["wall_s"])
    summary["reprefill_tokens"] = sum(r.get("reprefill_tokens", 0) for r in steps)
    summary["staleness_values"] = [s for r in steps for s in r["staleness"]]
    summary["timeline"] = [
        {"parked": r.get("parked", 0), **{k: r[k] for k in ("t", "replica", "running", "version")}}
        for r in records
        if r["kind"] == "replica"
    ]
    return summary


def table(results: list[dict[str, Any]]) -> str:
    base = next((r for r in results if r["label"] == "sync"), results[0])

    def ratio(r: dict[str, Any], key: str) -> str:
        b = base[key]
        return f"{r[key]:.1f} ({r[key] / b:.2f}x)" if b else f"{r[key]:.1f}"

    lines = [
        "| schedule | training tok/s (vs sync) | generation tok/s (vs sync) | replica busy | mean running "
        "| staleness p50/p99/max | actor stall mean/max (s) | re-prefilled tokens | KV used "
        "| waiting on tools (parked share; s a call queued for a worker) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s, st, u = r["staleness"], r["actor_stall_s"], r["utilisation"]
        tools = "-"
        if "tool_wait_share" in u:
            queued = r.get("tool_calls", {}).get("queued_s_per_call")
            tail = f"; {queued:.2f}" if queued is not None else ""
            tools = f"{u['tool_wait_share']:.2f} ({u['parked_share']:.2f}{tail})"
        kv = f"{u['kv_used']:.2f}" if "kv_used" in u else "-"
        lines.append(
            f"| {r['label']} | {ratio(r, 'train_tokens_per_s')} | {ratio(r, 'gen_tokens_per_s')} "
            f"| {u['busy']:.2f} | {u['mean_running']:.1f} "
            f"| {s['p50']:.0f}/{s['p99']:.0f}/{s['max']} | {st['mean']:.3f}/{st['max']:.3f} | {r['reprefill_tokens']} "
            f"| {kv} | {tools} |"
        )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], out: Path) -> None:
    labels = [r["label"] for r in results]
    fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
    ax[0].bar(labels, [r["train_tokens_per_s"] for r in results], color="tab:blue")
    ax[0].set(title="Training throughput", ylabel="trained tokens/s")
    ax[1].bar(labels, [r["gen_tokens_per_s"] for r in results], color="tab:orange")
    ax[1].set(title="Generation throughput", ylabel="response tokens/s")
    for a in ax:
        a.tick_params(axis="x", rotation=35)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(len(results), 1, figsize=(9, 1.5 * len(results)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        by_rep = defaultdict(list)
        for row in r["timeline"]:
            by_rep[row["replica"]].append(row)
        for rep, rows in sorted(by_rep.items()):
            for a, b in zip(rows, rows[1:]):
                ax.barh(
                    rep,
                    b["t"] - a["t"],
                    left=a["t"],
                    color="tab:green" if a["running"] else "tab:orange" if a.get("parked") else "lightgrey",
                    height=0.8,
                    linewidth=0,
                )
        ax.set_ylabel(r["label"], rotation=0, ha="right", fontsize=8)
        ax.set_yticks([])
    axes[-1, 0].set_xlabel("wall time (s); green = decoding, orange = only waiting on tools, grey = idle")
    fig.tight_layout()
    fig.savefig(out / "timelines.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(results), figsize=(2.2 * len(results), 2.6), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], results):
        v = r["staleness_values"]
        if v:
            ax.hist(v, bins=range(0, max(v) + 2), align="left", rwidth=0.8)
        ax.set_title(r["label"], fontsize=8)
        ax.set_xlabel("staleness")
    fig.tight_layout()
    fig.savefig(out / "staleness.png", dpi=110)
    plt.close(fig)


def command(config: str | None, overrides: list[str]) -> str:
    return " ".join(["laminar bench schedules", *(["--config", config] if config else []), *overrides])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="laminar bench schedules",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--config", default=None, help="YAML config for every schedule (default: the CPU workload)"
    )
    ap.add_argument("--out", default="runs/schedules-cpu")
    ap.add_argument("--only", default="", help="comma-separated labels to run (default: all)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides applied to every schedule")
    ap.add_argument(
        "--report",
        action="store_true",
        help="run nothing: rebuild schedules.json/.md and the plots from the variant folders under --out "
        "(for variants run in several calls); the meta of an existing schedules.json there is kept",
    )
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chosen = [v for v in VARIANTS if not args.only or v[0] in args.only.split(",")]
    overrides = list(args.overrides) if args.config else [*CPU_DEFAULTS, *args.overrides]
    meta = {
        "machine": platform.node(),
        "processor": platform.processor() or platform.machine(),
        "card": card(),
        "config": args.config,
        "overrides": overrides,
        "command": command(args.config, args.overrides),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "code": code_digest(),
    }
    if args.report:
        found = [label for label, _, _ in chosen if (out / label / "summary.json").exists()]
        if not found:
            raise SystemExit(f"--report: no variant folder with a summary.json under {out}")
        results = [collect(label, out / label) for label in found]
        if (out / "schedules.json").exists():
            meta = json.loads((out / "schedules.json").read_text())["meta"]
    else:
        results = [
            run_variant(label, sched, [*overrides, *extra], out, args.config)
            for label, sched, extra in chosen
        ]
    slim = [{k: v for k, v in r.items() if k not in ("timeline", "staleness_values")} for r in results]
    (out / "schedules.json").write_text(json.dumps({"meta": meta, "results": slim}, indent=2))
    cmd = meta.get("command") or command(meta["config"], meta["overrides"])  # older files have no command
    code = f", code {meta['code']}" if meta.get("code") else ""  # older files have no digest
    md = f"# Schedules on one workload\n\n`{cmd}`, {meta['when']}, on {meta['card']}{code}\n\n"
    (out / "schedules.md").write_text(md + table(results) + "\n")
    plot(results, out)
    print(table(results))
    return 0
