"""Figures of a set of simulated runs: throughput, GPU utilisation, staleness, time breakdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from laminar.sim.metrics import ACTIVITIES  # noqa: E402


def plot_runs(summaries: list[dict[str, Any]], out: Path) -> Path:
    """One figure with four panels comparing the schedules of one cluster and model."""
    names = [s["schedule"] for s in summaries]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    ax.bar(names, [s["training_throughput"] / 1e3 for s in summaries], color="tab:blue")
    ax.set_ylabel("training throughput (k tokens/s)")
    ax = axes[0][1]
    ax.bar(names, [s["gpu_utilisation"] for s in summaries], color="tab:green")
    ax.set_ylabel("rollout GPU busy fraction")
    ax.set_ylim(0, 1)
    ax = axes[1][0]
    width = 0.8 / max(1, len(summaries))
    for i, s in enumerate(summaries):
        dist = {int(k): v for k, v in s["staleness"]["distribution"].items()}
        total = sum(dist.values()) or 1
        xs = sorted(dist)
        ax.bar([x + i * width for x in xs], [dist[x] / total for x in xs], width=width, label=s["schedule"])
    ax.set_xlabel("staleness (trainer version - generator version)")
    ax.set_ylabel("share of trajectories")
    ax.legend(fontsize=7)
    ax = axes[1][1]
    bottom = [0.0] * len(summaries)
    for activity in (*ACTIVITIES, "idle"):
        values = [s["rollout_time"][activity] for s in summaries]
        ax.bar(names, values, bottom=bottom, label=activity)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("rollout time breakdown")
    ax.legend(fontsize=7)
    for a in axes.flat:
        a.tick_params(axis="x", labelrotation=30, labelsize=8)
    first = summaries[0]
    fig.suptitle(f"{first['model']} on {first['gpus']} GPUs (simulated)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_speedups(rows: list[dict[str, Any]], baselines: list[str], out: Path) -> Path:
    """Laminar's speed-up over each baseline against cluster size, one panel per model."""
    models = sorted({r["model"] for r in rows}, key=lambda m: float(m.rstrip("B")))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        sel = sorted((r for r in rows if r["model"] == model), key=lambda r: r["gpus"])
        for b in baselines:
            ax.plot([r["gpus"] for r in sel], [r["speedup"][b] for r in sel], marker="o", label=b)
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_xlabel("GPUs")
        ax.set_ylabel("Laminar speed-up (training throughput)")
        ax.set_title(f"Qwen2.5-{model}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
