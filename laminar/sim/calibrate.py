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
