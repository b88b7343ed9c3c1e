"""`laminar bench batches`: the engine alone on a replica's batch of short, grouped answers, where a small model
spends its time (the convergence runs' shape: 256 samples in groups of 8, 50-token prompts, answers of about a
dozen tokens with a lognormal tail).

Each batch is timed step by step, with the engine's pipelining off so that the phases follow one another: the
prefill steps, the decode steps, the scheduler and everything else; then
each captured decode graph is replayed alone, by batch size (the floor of a decode step). Random weights of a
named shape; answers end at their drawn length (EOS ignored). Writes `DIR/batches.json` and `DIR/batches.png`.
`--compare A.json B.json ...` plots earlier results side by side instead (e.g. an engine before and after a
change, measured in one call). A benchmark, never a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import defaultdict
from pathlib import Path

import torch

from laminar.engine.config import ModelConfig, SamplingParams
from laminar.engine.engine import Engine
from laminar.engine.random_model import SHAPES, shape_config
from laminar.telemetry.provenance import code_digest


def timed(obj, name: str, totals: dict, counts: dict, sync: bool) -> None:
    """Wrap `obj.name` so each call adds its wall time (after a device sync when `sync`) to `totals[name]`."""
    fn = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        if sync:
            torch.cuda.synchronize()
        totals[name] += time.perf_counter() - t
        counts[name] += 1
        return out

    setattr(obj, name, wrapper)


def answer_lengths(rng: random.Random, n: int, median: float, sigma: float, cap: int) -> list[int]:
    return [min(cap, max(1, round(math.exp(math.log(median) + sigma * rng.gauss(0, 1))))) for _ in range(n)]


def plot(results: list[tuple[str, dict]], path: Path) -> None:
    """Left: each measured batch's time, split into prefill, decode and the rest. Right: a decode graph's
    replay alone, by batch size. One colour per result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(results)
    for i, (label, r) in enumerate(results):
        rows = [b for b in r["batches"] if not b["warm_up"]]
        x = [b["batch"] + (i - (len(results) - 1) / 2) * width for b in rows]
        bottom = [0.0] * len(rows)
        for part, hatch in (("prefill_s", "//"), ("decode_s", ""), ("other_s", "..")):
            ms = [1e3 * (b[part] + (b["schedule_s"] if part == "other_s" else 0.0)) for b in rows]
            left.bar(
                x,
                ms,
                width,
                bottom=bottom,
                color=f"C{i}",
                hatch=hatch,
                edgecolor="white",
                label=f"{label}: {part[:-2]}",
            )
            bottom = [a + m for a, m in zip(bottom, ms)]
        graphs = {int(k): v for k, v in r["decode_graph_replay_ms"].items()}
        if graphs:
            right.plot(sorted(graphs), [graphs[k] for k in sorted(graphs)], "o-", color=f"C{i}", label=label)
    left.set(xlabel="batch (after the warm-up)", ylabel="ms", title="a batch of grouped short answers")
    left.legend(fontsize=7)
    right.set(xlabel="decode batch size", ylabel="ms", title="a decode step's CUDA graph, replayed alone")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="laminar bench batches", description=__doc__)
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--samples", type=int, default=256, help="a batch: samples (the engine's max_num_seqs)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=50)
    ap.add_argument("--answer-median", type=float, default=12.0)
    ap.add_argument("--answer-sigma", type=float, default=0.6, help="lognormal sigma of the answer length")
    ap.add_argument("--answer-max", type=int, default=200)
    ap.add_argument("--batches", type=int, default=6, help="the first is a warm-up, reported apart")
    ap.add_argument(
        "--share",
        default="on",
        choices=["on", "off"],
        help="a group's samples share its prompt's KV blocks (on, the engine's way) or each prefills it (off)",
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="runs/engine-batches")
    ap.add_argument(
        "--compare", nargs="+", metavar="JSON", help="plot earlier batches.json files, run nothing"
    )
    args = ap.parse_args(argv)
    if args.compare:
        results = []
        for name in args.compare:
            path = Path(name)
            try:
                results.append((path.stem, json.loads(path.read_text())))
            except (OSError, ValueError) as e:
                ap.error(f"--compare {name}: not a readable batches.json ({e})")
            if "batches" not in results[-1][1]:
                ap.error(
                    f"--compare {name}: has no 'batches'; expected a file written by laminar bench batches"
                )
        Path(args.out).mkdir(parents=True, exist_ok=True)
        plot(results, Path(args.out) / "batches.png")
        print(f"wrote {Path(args.out) / 'batches.png'}")
        return 0
    if args.samples % args.group_size:
        ap.error(f"--samples {args.samples} must be a multiple of --group-size {args.group_size}")
    cuda = args.device == "cuda"
    cfg = ModelConfig.from_hf(shape_config(args.shape))
    t = time.perf_counter()
    engine = Engine(
        cfg,
        device=args.device,
        dtype=torch.bfloat16 if cuda else torch.float32,
        max_num_seqs=args.samples,
        num_kv_blocks=args.samples * -(-(args.prompt + args.answer_max + 1) // 16) + 16,
        max_model_len=args.prompt + args.answer_max + 16,
        share_prompts=args.share == "on",
        pipeline=False,  # the phases of a step are timed one after another (pipelined, they overlap)
    )
    setup_s = time.perf_counter() - t
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    timed(engine.scheduler, "schedule", totals, counts, sync=False)
    timed(engine.runner, "prefill", totals, counts, sync=cuda)
    timed(engine.runner, "decode", totals, counts, sync=cuda)
    rng = random.Random(0)
    rows = []
    for b in range(args.batches):
        totals.clear()
        counts.clear()
        lengths = answer_lengths(rng, args.samples, args.answer_median, args.answer_sigma, args.answer_max)
        for g in range(args.samples // args.group_size):
            prompt = [rng.randrange(10, cfg.vocab_size) for _ in range(args.prompt)]
            for i in range(args.group_size):
                n = lengths[g * args.group_size + i]
                engine.add_request(f"{b}:{g}:{i}", prompt, SamplingParams(max_new_tokens=n, ignore_eos=True))
        steps = tokens = 0
        prefilled = engine.prefill_tokens
        t = time.perf_counter()
        while engine.has_unfinished():
            tokens += len(engine.step().new_tokens)
            steps += 1
        wall = time.perf_counter() - t
        row = {
            "batch": b,
            "warm_up": b == 0,
            "wall_s": round(wall, 4),
            "tokens": tokens,
            "tokens_per_s": round(tokens / wall),
            "longest_answer": max(lengths),
            "steps": steps,
            "prefill_steps": counts["prefill"],
            "prefill_tokens": engine.prefill_tokens - prefilled,
            "prefill_tokens_per_group": round(
                (engine.prefill_tokens - prefilled) / (args.samples // args.group_size), 1
            ),
            "prefill_s": round(totals["prefill"], 4),
            "decode_steps": counts["decode"],
            "decode_s": round(totals["decode"], 4),
            "decode_step_ms": round(1e3 * totals["decode"] / max(1, counts["decode"]), 3),
            "schedule_s": round(totals["schedule"], 4),
            "other_s": round(wall - totals["prefill"] - totals["decode"] - totals["schedule"], 4),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    graphs = {}
    for size, (graph, *_outs) in sorted(engine.runner.graphs.items()):
        graph.replay()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(50):
            graph.replay()
        torch.cuda.synchronize()
        graphs[size] = round((time.perf_counter() - t) / 50 * 1e3, 4)
    if graphs:
        print("decode graph replay, ms by batch size:", json.dumps(graphs), flush=True)
    measured = [r for r in rows if not r["warm_up"]]
    result = {
        "command": "laminar bench batches " + " ".join(argv or []),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "code": code_digest(),
        "args": {k: v for k, v in vars(args).items()},
        "engine_setup_s": round(setup_s, 2),
        "batches": rows,
        "median_batch_s": sorted(r["wall_s"] for r in measured)[len(measured) // 2] if measured else None,
        "median_prefill_s": sorted(r["prefill_s"] for r in measured)[len(measured) // 2]
        if measured
        else None,
        "median_tokens_per_s": sorted(r["tokens_per_s"] for r in measured)[len(measured) // 2]
        if measured
        else None,
        "prefill_tokens_per_group": measured[-1]["prefill_tokens_per_group"] if measured else None,
        "decode_graph_replay_ms": graphs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "batches.json").write_text(json.dumps(result, indent=1))
    plot([(args.shape, result)], out / "batches.png")
    print(f"median batch {result['median_batch_s']} s, median prefill {result['median_prefill_s']} s")
    print(f"wrote {out / 'batches.json'}")
    return 0
