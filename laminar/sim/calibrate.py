"""Fit the cost model to our benchmarks. Every fit takes the benchmark's files explicitly; the values fitted on
the committed measurements are constants in `laminar.sim.measured`, what `laminar simulate` uses without files.

- Decode (`from_engine_bench`, `laminar bench engine` on a GPU). The benchmark writes, per batch size, the
  measured decode step and the bytes a step must read (weights plus KV). Where decode is memory-bound
  (batch <= 64) the ratio of the datasheet roofline to the measured step is the engine's efficiency; its
  median becomes `decode_mem_eff`, with the per-step overhead folded into it (`step_overhead_s = 0`): two
  constants cannot be told apart on these rows. The efficiency carries over to the simulated card; its
  bandwidth and memory stay as configured (an H200 measurement calibrates an H800 simulation). Only the
  largest model's rows are used. CPU runs are ignored: they say nothing about an H100.
- The all-reduces of a tensor-parallel replica (`fit_tp_latency`, `laminar bench tp` files on a GPU): a step at
  TP=N over the roofline of its shard costs what TP=1 costs over its own roofline at the same batch, plus a fixed
  time each of its 2 x layers all-reduces (`tp_layer_latency_s`: the median over batch sizes up to 64).
- The trainer's MFU (`from_trainer_rows`, `laminar bench trainer` rows).
- Every constant of the small GPU schedule benchmark (`from_schedule_bench`), for `laminar simulate --validate`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
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


def fit_tp_latency(paths: Sequence[str | Path]) -> tuple[float, str]:
    """(`tp_layer_latency_s`, a note) from `laminar bench tp` files: for every decode step at TP > 1 run as CUDA
    graphs (the runtime's path) at a batch of at most 64, its time less its roofline times TP=1's ratio to the
    roofline for the same shape and batch, over its 2 x layers all-reduces; the median. A shape without a TP=1
    row in the files is left out."""
    ratio: dict[tuple[str, int], float] = {}
    steps = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        graphs = {d["tp"]: d.get("pipelined", False) for d in data["degrees"]}
        layers = data["shape"]["num_layers"]
        for r in data["rows"]:
            if r["batch"] > 64:
                continue
            if r["tp"] == 1:
                ratio[(data["model"], r["batch"])] = r["step_ms"] / r["roofline_ms"]
            elif graphs.get(r["tp"]):
                steps.append((data["model"], r, layers))
    per = [
        (r["step_ms"] - r["roofline_ms"] * ratio[(model, r["batch"])]) / 1e3 / (2 * layers)
        for model, r, layers in steps
        if (model, r["batch"]) in ratio
    ]
    if not per:
        raise ValueError(f"{', '.join(map(str, paths))}: no TP > 1 graph rows with a TP=1 row of their shape")
    fitted = float(np.median(per))
    note = (
        f"tp_layer_latency_s={fitted * 1e6:.1f} us an all-reduce: median of {len(per)} decode steps at TP > 1, "
        f"batch <= 64 ({', '.join(str(p) for p in paths)})"
    )
    return fitted, note


@dataclass(frozen=True)
class TrainerRow:
    """One `laminar bench trainer` row on a GPU, as the calibration reads it."""

    source: str  # the row's file, or the measurement a committed row came from
    params: float
    ranks: int
    mfu: float  # on the count of 6 x parameters x tokens
    machine: str
    shape: str
    tokens_per_s: float


def trainer_rows(paths: list[str | Path]) -> list[TrainerRow]:
    """The usable rows of `laminar bench trainer` files: CPU rows (no MFU) and rows measured beside other work on
    the same machine (`contended`) are left out. The cost model charges 6 x parameters x tokens (`train_s`), so a
    row's efficiency is its `mfu_6nd`, the figure on that count; rows written before the bench counted the
    products run give it as `mfu`."""
    rows = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        mfu = data.get("mfu_6nd", data.get("mfu"))
        if mfu and "ranks" in data and not data.get("contended"):
            rows.append(
                TrainerRow(
                    str(path),
                    data["params"],
                    data["ranks"],
                    mfu,
                    data["machine"],
                    data["shape"],
                    data["tokens_per_s"],
                )
            )
    return rows


def from_trainer_rows(rows: Sequence[TrainerRow], base: CostModel, params: float) -> tuple[CostModel, str]:
    """`train_mfu` from the row whose model is nearest the simulated one in parameters (on a log scale),
    preferring a sharded trainer (ranks > 1), as the simulated trainer is. The bench's step includes the
    optimizer, so `train_step_overhead_s` stays as configured (a conservative extra for gathers and data loading
    at scale)."""
    if not rows:
        return base, "no GPU trainer benchmark row: train_mfu unchanged"
    best = min(rows, key=lambda r: (abs(np.log(r.params / params)), r.ranks == 1, -r.mfu))
    note = (
        f"{best.source} ({best.machine}, {best.shape} on {best.ranks} GPUs): train_mfu={best.mfu:.3f} "
        f"(6 x parameters x tokens; {best.tokens_per_s:,.0f} tokens/s; was {base.train_mfu:.2f})"
    )
    return replace(base, train_mfu=float(best.mfu)), note


def from_trainer_bench(paths: list[str | Path], base: CostModel, params: float) -> tuple[CostModel, str]:
    """`from_trainer_rows` over the rows of `laminar bench trainer` files."""
    return from_trainer_rows(trainer_rows(paths), base, params)


# The small GPU schedule benchmark's variants: the baselines, and the runs whose weights went publish -> relays
# -> pull
BASELINES = ("sync", "one_step", "stream", "partial")
RELAY_RUNS = ("laminar", "laminar-norepack")


def read_run_steps(path: str | Path) -> list[dict]:
    """The step records of one run's `metrics.jsonl`, without a smoke run's records that come first (some run
    folders of the first GPU runs were reused and still held them: a step whose version is not above the
    previous step's starts the real run)."""
    steps = [r for r in map(json.loads, Path(path).read_text().splitlines()) if r.get("kind") == "step"]
    start = max(
        (i for i in range(1, len(steps)) if steps[i]["version"] <= steps[i - 1]["version"]), default=0
    )
    return steps[start:]


def gpu_run_steps(roots: Sequence[str | Path]) -> dict[str, list[dict]]:
    """{"<root>/<variant>": its step records}, over every run folder under `roots`."""
    out = {}
    for root in roots:
        for f in sorted(Path(root).glob("*/metrics.jsonl")):
            out[f"{Path(root).name}/{f.parent.name}"] = read_run_steps(f)
    return out


def gpu_run_summaries(roots: Sequence[str | Path]) -> dict[str, dict]:
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


@dataclass(frozen=True)
class MeasuredRun:
    """One run of the small GPU schedule benchmark: the figures the validation sets beside the simulated ones."""

    source: str  # where the run's records are
    train_tok_s: float  # training throughput, as its summary gives it
    staleness_max: int
    repacks: int
    reprefill_tokens: int  # over every step
    step_tokens: tuple[int, ...]  # the tokens each step trained
    window_step_s: tuple[float, float]  # mean trainer step over steps > 3: measured, and the trainer fit's


@dataclass(frozen=True)
class ScheduleCalibration:
    """The cost model the small GPU schedule benchmark measured, with a note a constant of where it comes from,
    the trainer fit's fixed part and its noise over a 10-step window, and the runs themselves (one mapping of
    variant to run a measured set, in run-seed order)."""

    cost: CostModel
    notes: dict[str, str]
    trainer_fixed_s: float
    window_sd_s: float
    runs: tuple[dict[str, MeasuredRun], ...]

    def with_train_shift(self, shift_s: float) -> CostModel:
        """The cost model with the trainer's fixed cost moved by `shift_s` (the validation's sensitivity band)."""
        return replace(self.cost, train_step_overhead_s=max(0.0, self.trainer_fixed_s + shift_s))


def from_schedule_bench(
    engine_path: str | Path,
    base: CostModel,
    params: float,
    roots: Sequence[str | Path],
    model: str = "qwen2.5-0.5b",
) -> ScheduleCalibration:
    """The cost model of the small GPU schedule benchmark, every constant that run measures taken from it:
    `engine_path` is the engine benchmark of its card, `roots` the run folders of each measured set (one folder
    a variant, each with `metrics.jsonl` and `summary.json`).

    - decode: `fit_decode` on the engine benchmark's rows of the same model and card, batch <= 64 (the runs'
      mean decode batch is 15-24);
    - trainer: `fit_trainer` on the per-step records of every run under `roots`: the fixed part becomes
      `train_step_overhead_s`, the per-token part `train_mfu` (achieved FLOP/s = 6 x params / seconds a token,
      on the one trainer GPU);
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
    empty = [str(r) for r in roots if not any(k.startswith(f"{Path(r).name}/") for k in runs)]
    if empty:
        raise ValueError(f"no run folder with a metrics.jsonl under {', '.join(empty)}")
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
        train_step_overhead_s=max(0.0, trainer["fixed_s"]),
        global_sync_overhead_s=max(0.0, push - fixed_push),
        publish_bw=weight_bytes / publish,
        relay_link_bw=weight_bytes / propagation,
        pull_overhead_s=max(0.0, pull - weight_bytes / base.h2d_pinned_bw),
        repack_overhead_s=repack_s,
    )
    t = trainer
    where = " and ".join(map(str, roots))
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
    measured = tuple(
        {
            key.split("/")[-1]: _measured_run(f"{root}/{key.split('/')[-1]}", steps, summaries[key], trainer)
            for key, steps in runs.items()
            if key.startswith(f"{Path(root).name}/")
        }
        for root in roots
    )
    return ScheduleCalibration(cost, notes, trainer["fixed_s"], trainer["residual_sd_s"] / 10**0.5, measured)


def _measured_run(source: str, steps: list[dict], summary: dict, fit: dict[str, float]) -> MeasuredRun:
    window = [r for r in steps if r["step"] > 3]
    measured = float(np.mean([r["step_time_s"] for r in window]))
    fitted = float(np.mean([fit["fixed_s"] + fit["per_token_s"] * r["tokens"] for r in window]))
    return MeasuredRun(
        source=source,
        train_tok_s=summary["train_tokens_per_s"],
        staleness_max=summary["staleness"]["max"],
        repacks=summary["repacks"]["count"],
        reprefill_tokens=sum(r.get("reprefill_tokens", 0) for r in steps),
        step_tokens=tuple(r["tokens"] for r in steps),
        window_step_s=(round(measured, 3), round(fitted, 3)),
    )
