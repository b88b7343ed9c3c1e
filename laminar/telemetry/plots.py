"""The run's plots, drawn from the records alone so any `metrics.jsonl` can be re-plotted later."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from laminar.telemetry.summary import moving_average  # noqa: E402


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_run(records: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    steps = [r for r in records if r["kind"] == "step"]
    replicas = [r for r in records if r["kind"] == "replica"]
    paths: list[Path] = []

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if steps:
        t = [r["t"] for r in steps]
        rewards = [float("nan") if r["reward_mean"] is None else r["reward_mean"] for r in steps]
        ax.plot(t, rewards, ".", alpha=0.4, label="per step")
        ax.plot(t, moving_average(rewards, 5), "-", label="moving average (5)")
    ax.set(xlabel="wall time (s)", ylabel="reward", title="Reward over wall time")
    ax.legend()
    paths.append(_save(fig, out / "reward.png"))

    evals = sorted((r for r in records if r["kind"] == "eval"), key=lambda r: r["version"])
    if evals:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        t = [r["t_version"] for r in evals]
        ax.plot(t, [r["accuracy"] for r in evals], "o-", label="held-out accuracy")
        ax2 = ax.twinx()
        ax2.plot(t, [r["response_len_mean"] for r in evals], "--", color="grey", label="mean response length")
        ax2.set_ylabel("response tokens")
        ax.set(
            xlabel="wall time the weights were published (s)",
            ylabel="accuracy",
            title="Held-out evaluation",
            ylim=(0, 1),
        )
        ax.legend(loc="upper left")
        ax2.legend(loc="lower right")
        paths.append(_save(fig, out / "eval.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    if len(steps) >= 2:
        t = [r["t"] for r in steps]
        tps = [r["tokens"] / max(t[i] - t[i - 1], 1e-6) for i, r in enumerate(steps) if i > 0]
        ax.plot(t[1:], moving_average(tps, 5), label="training (trained tokens/s)")
    by_rep: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in replicas:
        by_rep[r["replica"]].append(r)
    if replicas:
        ordered = sorted(replicas, key=lambda r: r["t"])
        latest: dict[int, int] = {}
        ts, totals = [], []
        for r in ordered:
            latest[r["replica"]] = r["tokens_generated"]
            ts.append(r["t"])
            totals.append(sum(latest.values()))
        rates = [(totals[i] - totals[i - 1]) / max(ts[i] - ts[i - 1], 1e-6) for i in range(1, len(ts))]
        k = max(1, len(by_rep) * 3)
        ax.plot(ts[1:], moving_average(rates, k), label="generation (response tokens/s)")
    ax.set(xlabel="wall time (s)", ylabel="tokens/s", title="Throughput")
    ax.legend()
    paths.append(_save(fig, out / "throughput.png"))

    fig, ax = plt.subplots(figsize=(5, 3.5))
    staleness = [s for r in steps for s in r.get("staleness", [])]
    if staleness:
        ax.hist(staleness, bins=range(0, max(staleness) + 2), align="left", rwidth=0.8)
    ax.set(xlabel="staleness (trainer version - generator version)", ylabel="trajectories", title="Staleness")
    paths.append(_save(fig, out / "staleness.png"))

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for rep, rows in sorted(by_rep.items()):
        t = [r["t"] for r in rows]
        ax1.plot(t, [r["kv_used"] / max(r["kv_total"], 1) for r in rows], label=f"replica {rep}")
        ax2.step(t, [r["version"] for r in rows], where="post", label=f"replica {rep}")
    ax1.set(ylabel="KV use", title="Replicas: KV-cache use and weight version")
    ax2.set(xlabel="wall time (s)", ylabel="weight version")
    if by_rep:
        ax1.legend(fontsize=7, ncol=4)
    paths.append(_save(fig, out / "replicas.png"))

    if any(r.get("tool_calls_mean") for r in steps):  # a run with tool turns
        fig, ax = plt.subplots(figsize=(6, 3.5))
        t = [r["t"] for r in steps]
        share = [r.get("tool_call_frac", float("nan")) for r in steps]
        calls = [r.get("tool_calls_mean", float("nan")) for r in steps]
        ax.plot(t, moving_average(share, 5), "-", label="trajectories that called a tool (share)")
        ax.plot(t, moving_average(calls, 5), "--", label="tool calls per trajectory")
        ax.plot(
            t,
            moving_average(
                [float("nan") if r["reward_mean"] is None else r["reward_mean"] for r in steps], 5
            ),
            ":",
            label="reward",
        )
        ax.set(xlabel="wall time (s)", ylabel="moving average (5 steps)", title="Tool use over wall time")
        ax.legend(fontsize=8)
        paths.append(_save(fig, out / "tools.png"))
    return paths


def main(argv: list[str] | None = None) -> int:
    """`laminar plot RUN_DIR`: the run's plots drawn again from its `metrics.jsonl` (a run with `run.plots=false`,
    or one brought back from another machine)."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(prog="laminar plot", description=main.__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a run folder written by `laminar train`")
    args = ap.parse_args(argv)
    log = Path(args.run_dir) / "metrics.jsonl"
    if not log.is_file():
        print(
            f"laminar plot: {log} does not exist; give a run folder written by `laminar train`",
            file=sys.stderr,
        )
        return 2
    records = []
    for n, line in enumerate(log.read_text().splitlines(), 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a run killed mid-write leaves a cut last line
            print(f"laminar plot: {log} line {n} is not JSON; skipped", file=sys.stderr)
    for path in plot_run(records, args.run_dir):
        print(path)
    return 0
