"""Fit the cost model's decode efficiency to our engine benchmark (`laminar bench engine` on a GPU).

The benchmark writes, per batch size, the measured decode step and the bytes a step must read (weights plus
KV). Where decode is memory-bound (batch <= 64) the ratio of the datasheet roofline to the measured step is
the engine's efficiency; its median becomes `decode_mem_eff`, with the per-step overhead folded into it
(`step_overhead_s = 0`): two constants cannot be told apart on these rows. The efficiency carries over to
the simulated card; its bandwidth and memory stay as configured (an H200 measurement calibrates an H800
simulation). Only the largest model's rows are used. CPU runs are ignored: they say nothing about an H100.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from laminar.sim.cost import CostModel


def from_engine_bench(path: str | Path, base: CostModel) -> tuple[CostModel, str]:
    """The calibrated model and a one-line note of what was fitted (or why nothing was)."""
    data = json.loads(Path(path).read_text())
    if data.get("device") != "cuda" or not data.get("runs"):
        return base, f"{path}: not a GPU run, constants unchanged"
    measured_bw = (
        CostModel.h200().gpu_hbm_bw if "H200" in data.get("device_name", "") else CostModel().gpu_hbm_bw
    )
    run = max(data["runs"], key=lambda r: r.get("weight_bytes_per_step", 0))
    rows = [r for r in run.get("engine", []) if "roofline_bytes_per_step" in r]
    if not rows:
        return base, f"{path}: no engine rows, constants unchanged"
    bound = [r for r in rows if r.get("batch", 0) <= 64] or rows
    eff = float(
        np.median([r["roofline_bytes_per_step"] / measured_bw / (r["decode_step_ms"] / 1e3) for r in bound])
    )
    eff = min(1.0, eff)
    fitted = replace(base, decode_mem_eff=eff, step_overhead_s=0.0)
    note = (
        f"{path} ({data.get('device_name')}, {run.get('model')}): decode_mem_eff={eff:.2f}, "
        f"step_overhead_s=0 (folded in) from {len(bound)} memory-bound batch sizes"
    )
    return fitted, note


# The trainer's measured step time on the small GPU run (results/schedules-gpu/schedules.md, "the trainer's
# own train_step time is 3.0-3.7 s in every schedule"; its per-step records were not committed): the midpoint,
# and the range for the sensitivity columns. Its tokens a step are those of the run's own workload (below).
GPU_TRAIN_STEP_S = (3.0, 3.35, 3.7)


def fit_decode(rows: list[dict], bandwidth: float) -> tuple[float, float]:
    """(decode_mem_eff, step_overhead_s) by least squares of `step = overhead + bytes / (bandwidth * eff)` over
    an engine benchmark's rows (decode step and the weight + KV bytes it reads). On a small model the step has
    a large fixed part (kernel launches), so the two constants separate."""
    x = np.array([r["roofline_bytes_per_step"] for r in rows], dtype=float)
    y = np.array([r["decode_step_ms"] / 1e3 for r in rows], dtype=float)
    slope, overhead = np.polyfit(x, y, 1)
    return float(min(1.0, 1.0 / (slope * bandwidth))), float(max(0.0, overhead))


def from_schedule_bench(
    engine_path: str | Path,
    schedules_path: str | Path,
    base: CostModel,
    params: float,
    train_tokens_per_step: float,
    train_step_s: float = GPU_TRAIN_STEP_S[1],
    model: str = "qwen2.5-0.5b",
) -> tuple[CostModel, dict[str, str]]:
    """The cost model of the small GPU schedule benchmark, every constant that run measures taken from it.

    - decode: `fit_decode` on the engine benchmark's rows of the same model and card, batch <= 64 (the runs'
      mean decode batch is 11-17);
    - trainer: achieved FLOP/s = 6 x params x tokens a step / measured step time, as `train_mfu` of the card's
      peak, no separate per-step overhead (one number cannot split the two);
    - weights: the baselines' global push = the mean actor stall of sync / one_step / stream / partial (every
      push pauses trainer and rollouts); Laminar's publish = its mean actor stall; relay arrival = its mean
      publish-to-relay propagation; pull = the mean pull time of all runs; repack = Laminar's mean overhead.
    These are component times of the run (the weight path, the engine, the trainer), the same for every
    schedule; no schedule's throughput enters the calibration.
    """
    engine = json.loads(Path(engine_path).read_text())
    run = next(r for r in engine["runs"] if r["model"] == model)
    rows = [r for r in run["engine"] if r["batch"] <= 64]
    eff, overhead = fit_decode(rows, base.gpu_hbm_bw)
    results = {r["schedule"]: r for r in json.loads(Path(schedules_path).read_text())["results"]}
    weight_bytes = params * 2
    baselines = [results[s]["actor_stall_s"]["mean"] for s in ("sync", "one_step", "stream", "partial")]
    push = float(np.mean(baselines))
    lam = results["laminar"]
    pull = float(np.mean([r["pull_s"]["mean"] for r in results.values()]))
    fixed_push = weight_bytes / base.ib_bw_per_gpu + base.collective_hop_latency_s * 1.585  # log2(3 GPUs)
    achieved = base.train_flops_per_param_token * params * train_tokens_per_step / train_step_s
    cost = replace(
        base,
        decode_mem_eff=eff,
        step_overhead_s=overhead,
        train_mfu=achieved / base.gpu_flops,
        train_step_overhead_s=0.0,
        global_sync_overhead_s=max(0.0, push - fixed_push),
        publish_bw=weight_bytes / lam["actor_stall_s"]["mean"],
        relay_link_bw=weight_bytes / lam["relay_propagation_s"]["mean"],
        pull_overhead_s=max(0.0, pull - weight_bytes / base.h2d_pinned_bw),
        repack_overhead_s=lam["repacks"]["overhead_s"]["mean"],
    )
    notes = {
        "decode_mem_eff": f"{eff:.3f} of {base.gpu_hbm_bw / 1e12:.1f} TB/s: fit to {engine_path} {model}, "
        f"{len(rows)} batch sizes <= 64",
        "step_overhead_s": f"{overhead * 1e3:.2f} ms: same fit (kernel launches of a small model)",
        "train_mfu": f"{achieved / base.gpu_flops:.4f} ({achieved / 1e12:.1f} TFLOP/s achieved): "
        f"6 x {params:.3g} x {train_tokens_per_step:.0f} tokens / {train_step_s} s measured train step",
        "global_sync_overhead_s": f"{push - fixed_push:.3f} s: mean actor stall {push:.3f} s of the four "
        f"baselines in {schedules_path}",
        "publish_bw": f"{weight_bytes / lam['actor_stall_s']['mean'] / 1e9:.1f} GB/s: laminar's mean actor "
        f"stall {lam['actor_stall_s']['mean']:.3f} s",
        "relay_link_bw": f"{weight_bytes / lam['relay_propagation_s']['mean'] / 1e9:.2f} GB/s: laminar's mean "
        f"relay propagation {lam['relay_propagation_s']['mean']:.3f} s",
        "pull_overhead_s": f"{max(0.0, pull - weight_bytes / base.h2d_pinned_bw):.3f} s: mean pull {pull:.3f} s",
        "repack_overhead_s": f"{lam['repacks']['overhead_s']['mean']:.3f} s: laminar's mean repack overhead",
    }
    return cost, notes
