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


def from_trainer_bench(paths: list[str | Path], base: CostModel, params: float) -> tuple[CostModel, str]:
    """`train_mfu` from `laminar bench trainer` on a GPU (results/trainer/*/trainer.json): the row whose model is
    nearest the simulated one in parameters (on a log scale), preferring a sharded trainer (ranks > 1), as the
    simulated trainer is. The bench's step includes the optimizer, so `train_step_overhead_s` stays as
    configured (a conservative extra for gathers and data loading at scale). CPU rows are ignored, and so are
    rows measured beside other work on the same machine (`contended`).

    The cost model charges 6 x parameters x tokens (`train_s`), so its efficiency is the row's `mfu_6nd`, the
    figure on that count; rows written before the bench counted the products run give it as `mfu`."""
    rows = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        mfu = data.get("mfu_6nd", data.get("mfu"))
        if mfu and "ranks" in data and not data.get("contended"):
            rows.append((path, data, mfu))
    if not rows:
        return base, "no GPU trainer benchmark (results/trainer/*/trainer.json): train_mfu unchanged"
    path, best, mfu = min(
        rows, key=lambda r: (abs(np.log(r[1]["params"] / params)), r[1]["ranks"] == 1, -r[2])
    )
    note = (
        f"{path} ({best['machine']}, {best['shape']} on {best['ranks']} GPUs): train_mfu={mfu:.3f} "
        f"(6 x parameters x tokens; {best['tokens_per_s']:,.0f} tokens/s; was {base.train_mfu:.2f})"
    )
    return replace(base, train_mfu=float(mfu)), note


# The small GPU schedule runs: every variant, 12 steps, two seeds (`results/schedules-gpu-repeats`).
GPU_RUNS = ("results/schedules-gpu-repeats/seed0", "results/schedules-gpu-repeats/seed1")
BASELINES = ("sync", "one_step", "stream", "partial")
RELAY_RUNS = ("laminar", "laminar-norepack")  # the runs whose weights went publish -> relays -> pull


def read_run_steps(path: str | Path) -> list[dict]:
    """The step records of one run's `metrics.jsonl`, without a smoke run's records that come first (a step
    whose version is not above the previous step's starts the real run; results/schedules-gpu/runs/README.md)."""
    steps = [r for r in map(json.loads, Path(path).read_text().splitlines()) if r.get("kind") == "step"]
    start = max(
        (i for i in range(1, len(steps)) if steps[i]["version"] <= steps[i - 1]["version"]), default=0
    )
    return steps[start:]


def gpu_run_steps(roots: tuple[str, ...] = GPU_RUNS) -> dict[str, list[dict]]:
    """{"<root>/<variant>": its step records}, over every run folder under `roots`."""
    out = {}
    for root in roots:
        for f in sorted(Path(root).glob("*/metrics.jsonl")):
            out[f"{Path(root).name}/{f.parent.name}"] = read_run_steps(f)
    return out


def gpu_run_summaries(roots: tuple[str, ...] = GPU_RUNS) -> dict[str, dict]:
    """{"<root>/<variant>": its summary.json}, over every run folder under `roots`."""
    return {
        f"{Path(root).name}/{f.parent.name}": json.loads(f.read_text())
        for root in roots
        for f in sorted(Path(root).glob("*/summary.json"))
    }


def fit_trainer(runs: dict[str, list[dict]], first_step: int = 2) -> dict[str, float]:
    """The trainer's `step_time_s` (Trainer.train_step: 16 micro-batches of 4 sequences forward and backward,
    clip, AdamW) as `fixed + per_token x tokens` by least squares over every run's steps from `first_step` on
    (step 1 carries CUDA warm-up: its mean is reported, not fitted). The gpu-schedules workload gives all 8
    samples of a group one length and a micro-batch holds 4 samples of one group, so padded tokens = tokens
    here: a per-padded-token term cannot be told apart from the per-token one on these records."""
    rows = [
        (r["tokens"], r["step_time_s"]) for steps in runs.values() for r in steps if r["step"] >= first_step
    ]
    x = np.array([t for t, _ in rows], dtype=float)
    y = np.array([s for _, s in rows], dtype=float)
    slope, fixed = np.polyfit(x, y, 1)
    resid = y - (fixed + slope * x)
    se_slope = float(np.sqrt(resid.var(ddof=2) / ((x - x.mean()) ** 2).sum()))
    first = [r["step_time_s"] for steps in runs.values() for r in steps if r["step"] == 1]
    return {
        "fixed_s": float(fixed),
        "per_token_s": float(slope),
        "per_token_se_s": se_slope,
        "residual_sd_s": float(resid.std(ddof=2)),
        "n": len(rows),
        "tokens_min": float(x.min()),
        "tokens_max": float(x.max()),
        "mean_s": float(y.mean()),
        "first_step_mean_s": float(np.mean(first)),
        "corr": float(np.corrcoef(x, y)[0, 1]),
    }


def baseline_push_stall(runs: dict[str, list[dict]], first_step: int = 4) -> tuple[float, float]:
    """(steady, early) mean actor stall of the four baselines' global pushes, from the step records' `stall_s`:
    steps from `first_step` on (the benchmark's measured window: steps 4-6) and the steps before. Every
    baseline, sync included (whose rollouts are idle at the push), pays 1.4-2.0 s on its first three pushes
    and about 0.8 s after, so the early pushes are a warm-up of the push path, not a schedule effect."""
    base = {k: v for k, v in runs.items() if k.split("/")[-1] in BASELINES}
    steady = [r["stall_s"] for v in base.values() for r in v if r["step"] >= first_step]
    early = [r["stall_s"] for v in base.values() for r in v if r["step"] < first_step]
    return float(np.mean(steady)), float(np.mean(early))


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
    base: CostModel,
    params: float,
    roots: tuple[str, ...] = GPU_RUNS,
    train_shift_s: float = 0.0,
    model: str = "qwen2.5-0.5b",
) -> tuple[CostModel, dict[str, str]]:
    """The cost model of the small GPU schedule benchmark, every constant that run measures taken from it.

    - decode: `fit_decode` on the engine benchmark's rows of the same model and card, batch <= 64 (the runs'
      mean decode batch is 15-24);
    - trainer: `fit_trainer` on the per-step records of every run under `roots`: the fixed part becomes
      `train_step_overhead_s` (+ `train_shift_s`, for the sensitivity columns), the per-token part `train_mfu`
      (achieved FLOP/s = 6 x params / seconds a token, on the one trainer GPU);
    - weights: the baselines' global push = their mean actor stall over the measured window's steps
      (`baseline_push_stall`); Laminar's publish = the relay runs' mean stall over the same steps; relay
      arrival = their mean publish-to-relay propagation; pull = the mean pull time of every run; repack = the
      mean overhead of the rounds that moved something.
    These are component times of the runs (the weight path, the engine, the trainer), the same for every
    schedule; no schedule's throughput enters the calibration.
    """
    engine = json.loads(Path(engine_path).read_text())
    run = next(r for r in engine["runs"] if r["model"] == model)
    rows = [r for r in run["engine"] if r["batch"] <= 64]
    eff, overhead = fit_decode(rows, base.gpu_hbm_bw)
    runs = gpu_run_steps(roots)
    summaries = gpu_run_summaries(roots)
    relay = {k: v for k, v in summaries.items() if k.split("/")[-1] in RELAY_RUNS}
    weight_bytes = params * 2
    trainer = fit_trainer(runs)
    per_token = max(trainer["per_token_s"], 1e-9)
    achieved = base.train_flops_per_param_token * params / per_token
    push, push_early = baseline_push_stall(runs)
    lam_stall = [
        r["stall_s"] for k, v in runs.items() if k.split("/")[-1] in RELAY_RUNS for r in v if r["step"] >= 4
    ]
    publish = float(np.mean(lam_stall))
    propagation = float(np.mean([s["relay_propagation_s"]["mean"] for s in relay.values()]))
    pull = float(np.mean([s["pull_s"]["mean"] for s in summaries.values()]))
    repack = [s["repacks"]["overhead_s"]["mean"] for s in relay.values() if s["repacks"]["count"]]
    repack_s = float(np.mean(repack)) if repack else base.repack_overhead_s
    fixed_push = weight_bytes / base.ib_bw_per_gpu + base.collective_hop_latency_s * 1.585  # log2(3 GPUs)
    cost = replace(
        base,
        decode_mem_eff=eff,
        step_overhead_s=overhead,
        train_mfu=achieved / base.gpu_flops,
        train_step_overhead_s=max(0.0, trainer["fixed_s"] + train_shift_s),
        global_sync_overhead_s=max(0.0, push - fixed_push),
        publish_bw=weight_bytes / publish,
        relay_link_bw=weight_bytes / propagation,
        pull_overhead_s=max(0.0, pull - weight_bytes / base.h2d_pinned_bw),
        repack_overhead_s=repack_s,
    )
    t = trainer
    where = " and ".join(roots)
    notes = {
        "decode_mem_eff": f"{eff:.3f} of {base.gpu_hbm_bw / 1e12:.1f} TB/s: fit to {engine_path} {model}, "
        f"{len(rows)} batch sizes <= 64",
        "step_overhead_s": f"{overhead * 1e3:.2f} ms: same fit (kernel launches of a small model)",
        "train_step_overhead_s": f"{t['fixed_s']:.3f} s: fixed part of step_time_s = fixed + per_token x tokens, "
        f"least squares over {t['n']} steps (step >= 2) of the {len(runs)} runs' metrics.jsonl under {where} "
        f"({t['tokens_min']:,.0f}-{t['tokens_max']:,.0f} tokens a step, mean {t['mean_s']:.2f} s, residual sd "
        f"{t['residual_sd_s']:.2f} s, correlation with tokens {t['corr']:.2f}; step 1 averages "
        f"{t['first_step_mean_s']:.2f} s, CUDA warm-up, not modelled)",
        "train_mfu": f"{achieved / base.gpu_flops:.3f} ({achieved / 1e12:.0f} TFLOP/s achieved): per-token part "
        f"of the same fit, {per_token * 1e6:.1f} +- {t['per_token_se_s'] * 1e6:.1f} us a token (1 s.e.)",
        "global_sync_overhead_s": f"{push - fixed_push:.3f} s: mean actor stall {push:.3f} s of the four "
        f"baselines' steps >= 4 (step records' stall_s; their steps 1-3 average {push_early:.2f} s, warm-up)",
        "publish_bw": f"{weight_bytes / publish / 1e9:.1f} GB/s: mean actor stall {publish:.3f} s over steps >= 4 "
        f"of the {len(relay)} relay runs ({', '.join(RELAY_RUNS)})",
        "relay_link_bw": f"{weight_bytes / propagation / 1e9:.2f} GB/s: their mean relay propagation "
        f"{propagation:.3f} s",
        "pull_overhead_s": f"{max(0.0, pull - weight_bytes / base.h2d_pinned_bw):.3f} s: mean pull {pull:.3f} s "
        f"over all {len(summaries)} runs",
        "repack_overhead_s": f"{repack_s:.3f} s: mean overhead of a repack round that moved something",
    }
    return cost, notes
