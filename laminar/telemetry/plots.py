"""The run's plots, drawn from the records alone so any `metrics.jsonl` can be re-plotted later."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from laminar.telemetry.summary import moving_average  # noqa: E402


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def window_rates(
    steps: list[dict[str, Any]], by_replica: dict[int, list[dict[str, Any]]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(window edges, trained tokens/s, generated tokens/s) over equal windows of wall time, a fortieth of the
    run and at least a second: each step's tokens, and each replica report's tokens since that replica's last,
    land whole in the window of their time, so the rates do not spike with the reports' spacing."""
    end = max([r["t"] for r in steps] + [r["t"] for rows in by_replica.values() for r in rows] + [0.0])
    width = max(end / 40, 1.0)
    edges = np.arange(0.0, end + width, width)
    if len(edges) < 2:
        edges = np.array([0.0, width])
    trained, generated = np.zeros(len(edges) - 1), np.zeros(len(edges) - 1)
    last = len(trained) - 1
    for r in steps:
        trained[min(int(r["t"] // width), last)] += r["tokens"]
    for rows in by_replica.values():
        before = 0
        for r in sorted(rows, key=lambda r: r["t"]):
            generated[min(int(r["t"] // width), last)] += r["tokens_generated"] - before
            before = r["tokens_generated"]
    return edges, trained / width, generated / width


def _rate(ax: Any, t: np.ndarray, rate: np.ndarray, label: str, color: str) -> None:
    """A windowed rate and its mean over the windows that had any (the run's steady rate, named)."""
    ax.plot(t, rate, "-", color=color, label=label)
    busy = rate[rate > 0]
    if busy.size:
        ax.axhline(
            float(busy.mean()), linestyle="--", color=color, alpha=0.5, label=f"mean {busy.mean():,.0f}"
        )
    ax.set(ylabel="tokens/s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower right")


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

    by_rep: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in replicas:
        by_rep[r["replica"]].append(r)
    # Throughput as rates over equal windows of wall time; training and generation on their own axes, as
    # generation's rate is often ten times training's.
    edges, trained, generated = window_rates(steps, by_rep)
    width = float(edges[1] - edges[0])
    centres = edges[:-1] + width / 2
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    _rate(top, centres, trained, "trained tokens/s", "C0")
    _rate(bottom, centres, generated, "generated tokens/s (all replicas)", "C1")
    top.set(title=f"Throughput ({width:.0f} s windows)")
    bottom.set(xlabel="wall time (s)")
    paths.append(_save(fig, out / "throughput.png"))

    fig, ax = plt.subplots(figsize=(5, 3.5))
    staleness = [s for r in steps for s in r.get("staleness", [])]
    if staleness:
        ax.hist(staleness, bins=range(0, max(staleness) + 2), align="left", rwidth=0.8)
    ax.set(xlabel="staleness (trainer version - generator version)", ylabel="trajectories", title="Staleness")
    paths.append(_save(fig, out / "staleness.png"))

    # KV use as a heat map (a row a replica, a column a window: one readable panel at 2 replicas or 64) above
    # each replica's weight version
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    kv = np.full((max(len(by_rep), 1), len(centres)), np.nan)
    for row, (rep, rows) in enumerate(sorted(by_rep.items())):
        for r in rows:
            col = min(int(r["t"] // width), len(centres) - 1)
            use = r["kv_blocks_used"] / max(r["kv_blocks_total"], 1)
            kv[row, col] = use if np.isnan(kv[row, col]) else max(kv[row, col], use)
        t = [r["t"] for r in rows]
        ax2.step(t, [r["version"] for r in rows], where="post", linewidth=0.8, label=f"replica {rep}")
    image = ax1.imshow(
        kv,
        aspect="auto",
        interpolation="nearest",
        origin="lower",
        extent=(0.0, float(edges[-1]), -0.5, kv.shape[0] - 0.5),
        vmin=0.0,
        vmax=1.0,
        cmap="viridis",
    )
    fig.colorbar(image, ax=ax1, label="KV use (most in window)")
    reps = sorted(by_rep)
    ticks = range(0, len(reps), max(1, len(reps) // 8))  # at most about 8 labels
    ax1.set_yticks(list(ticks), [str(reps[i]) for i in ticks])
    ax1.set(ylabel="replica", title="Replicas: KV-cache use and weight version")
    ax2.set(xlabel="wall time (s)", ylabel="weight version")
    if 0 < len(by_rep) <= 8:
        ax2.legend(fontsize=7, ncol=4)
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
