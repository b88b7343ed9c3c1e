"""Fit the cost model's decode constants to our engine benchmark (`laminar bench engine` on a GPU).

The benchmark writes, per batch size, the measured decode step and the bytes a step must read (weights plus
KV). A least-squares line `step = overhead + bytes / achieved_bandwidth` gives `step_overhead_s` and
`decode_mem_eff = achieved_bandwidth / gpu_hbm_bw`. CPU runs are ignored: they say nothing about an H100.
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
    if "H200" in data.get("device_name", ""):
        base = replace(base, gpu_hbm_bw=CostModel.h200().gpu_hbm_bw, gpu_memory=CostModel.h200().gpu_memory)
    rows = [r for run in data["runs"] for r in run.get("engine", []) if "roofline_bytes_per_step" in r]
    if len(rows) < 3:
        return base, f"{path}: fewer than 3 engine rows, constants unchanged"
    x = np.array([r["roofline_bytes_per_step"] for r in rows])
    y = np.array([r["decode_step_ms"] / 1e3 for r in rows])
    slope, intercept = np.polyfit(x, y, 1)
    if slope <= 0:
        return base, f"{path}: step time does not grow with bytes, constants unchanged"
    eff = min(1.0, 1.0 / slope / base.gpu_hbm_bw)
    fitted = replace(base, decode_mem_eff=float(eff), step_overhead_s=float(max(intercept, 0.0)))
    note = (
        f"{path} ({data.get('device_name')}): decode_mem_eff={eff:.2f}, "
        f"step_overhead_s={fitted.step_overhead_s * 1e3:.2f} ms from {len(rows)} batch sizes"
    )
    return fitted, note
