"""`laminar bench tp`: the decode step of a tensor-parallel engine against its memory roofline, by degree and batch.

For each degree N, N processes (torch.multiprocessing; NCCL and one GPU a rank on CUDA, gloo on CPU) build the
engine with random weights. Each rank builds only its shard (`Engine(weights=None)` makes the network of
`local_config`, this rank's heads and MLP columns), so no process ever holds the whole model. Every sequence's
cache is filled by prefill, then decode steps are timed with the ranks in lockstep (their all-reduces tie them)
and rank 0 reports the median.

The roofline of a step is what one GPU must read, over one GPU's measured copy bandwidth (`measure_bandwidth`):
its shard of the weights as built (sharded matrices 1/N each; lm_head and norms whole; the embedding table only
at the batch's rows, as in `laminar bench engine`) plus its KV heads' cache for every token the batch reads.

The engine's decode path runs as it does in service: with one rank, CUDA graphs and pipelined steps (each step
queued before the last one's tokens reach the host), and with several the same, NCCL all-reduces captured in the
graphs; `--tp-eager` runs TP>1 eagerly, one step at a time, and `--eager` every degree, to tell the graphs'
share from tensor parallelism's.
"""

from __future__ import annotations

import argparse
import json
import shlex
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from laminar.bench.tp_rank import BLOCK_SIZE, parse_degrees, rank_main, roofline
from laminar.engine.random_model import SHAPES, model_config
from laminar.engine.tensor_parallel import ALLREDUCE, check_degree
from laminar.telemetry.provenance import code_digest


# ---- the driver ---------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_degree(world: int, s: dict, timeout_s: float) -> dict:
    """Spawn the `world` ranks of one degree and return rank 0's report, or one that names the error."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        s = {**s, "port": free_port()}
        ctx = mp.start_processes(
            rank_main, args=(world, s, str(out)), nprocs=world, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(1.0, min(30.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.kill()
                    return {"tp": world, "rows": [], "error": f"did not finish within {timeout_s:.0f} s"}
        except mp.ProcessException as e:
            return {"tp": world, "rows": [], "error": str(e).strip().splitlines()[-1][:500], "trace": str(e)}
        return json.loads(out.read_text())


def finish_rows(report: dict, hidden_bytes: int) -> list[dict]:
    """Rank 0's timings with their roofline, ratio, tokens/s and all-reduce share."""
    rows = []
    for r in report["rows"]:
        total, roof_s = roofline(
            report["weight_bytes_per_rank"],
            report["kv_bytes_per_token_per_rank"],
            hidden_bytes,
            r["batch"],
            r["mean_context"],
            report["bandwidth_bytes_per_s"],
        )
        row = {
            "tp": report["tp"],
            **{k: v for k, v in r.items() if k != "step_ms_all"},
            "roofline_bytes": total,
            "roofline_ms": 1e3 * roof_s,
            "step_over_roofline": r["step_ms"] / (1e3 * roof_s),
            "tokens_per_s": r["batch"] / (r["step_ms"] / 1e3),
            "step_ms_all": r["step_ms_all"],
        }
        if "allreduce_ms" in r:
            row["allreduce_share"] = r["allreduce_ms"] / r["step_ms"]
        rows.append(row)
    return rows


def git_commit() -> str | None:
    """The checkout's short commit, where there is one (a GPU machine's copy of the tree may have none)."""
    try:
        got = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = got.stdout.strip()
    return commit if got.returncode == 0 and commit else None


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(result: dict) -> str:
    """The table of every (degree, batch), then what did not fit or failed."""
    m = result["meta"]
    lines = [
        f"# laminar bench tp: {result['model']}, {m['dtype']}, context {result['context']}",
        "",
        f"{m['device_name']} x{m['device_count'] or 1}; torch {m['torch']}; commit {m['commit'] or '-'} "
        f"(code {m['code']}); `{m['command']}`",
        "",
        "| TP | batch | step ms | roofline ms | step/roofline | tokens/s | all-reduce ms | all-reduce share "
        "| graphs |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    graphs = {d["tp"]: bool(d.get("cuda_graph_sizes")) for d in result["degrees"]}
    for r in result["rows"]:
        lines.append(
            f"| {r['tp']} | {r['batch']} | {r['step_ms']:.3f} | {r['roofline_ms']:.3f} | "
            f"{r['step_over_roofline']:.2f} | {r['tokens_per_s']:.0f} | {fmt(r.get('allreduce_ms'), '.3f')} | "
            f"{fmt(r.get('allreduce_share'), '.0%')} | {'yes' if graphs.get(r['tp']) else 'no'} |"
        )
    notes = []
    for d in result["degrees"]:
        if "weight_bytes_per_rank" in d:
            notes.append(
                f"- TP={d['tp']}: copy bandwidth {d['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s (rank 0); each rank "
                f"reads {d['weight_bytes_per_rank'] / 1e9:.3f} GB of weights a step and holds "
                f"{d['kv_heads_per_rank']} KV head(s); CUDA graphs {'yes' if d['cuda_graph_sizes'] else 'no'}, "
                f"pipelined {'yes' if d['pipelined'] else 'no'}"
            )
        notes += [
            f"- TP={d['tp']} batch {sk['batch']} skipped: {sk['reason']}" for sk in d.get("skipped", [])
        ]
        if d.get("error"):
            notes.append(f"- TP={d['tp']} failed: {d['error']}")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def plot(result: dict, path: Path) -> bool:
    """Step ms against batch size, one line a degree, its roofline dashed in the same colour; False where
    matplotlib is missing (a bare GPU image)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, d in enumerate(sorted({r["tp"] for r in result["rows"]})):
        rows = sorted((r for r in result["rows"] if r["tp"] == d), key=lambda r: r["batch"])
        batches = [r["batch"] for r in rows]
        color = f"C{i}"
        ax.plot(batches, [r["step_ms"] for r in rows], "o-", color=color, label=f"TP={d} step")
        ax.plot(batches, [r["roofline_ms"] for r in rows], "--", color=color, label=f"TP={d} roofline")
    ax.set_xscale("log", base=2)
    ticks = sorted({r["batch"] for r in result["rows"]})
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.minorticks_off()
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("decode step (ms)")
    ax.set_title(f"{result['model']} {result['meta']['dtype']}, context {result['context']}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="laminar bench tp", description=__doc__)
    p.add_argument("--model", default=None, choices=sorted(SHAPES), help="a named shape (random weights)")
    p.add_argument("--tp", type=parse_degrees, default=[1, 2], help="degrees to run, e.g. 1,2,4")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    p.add_argument(
        "--context", type=int, default=512, help="tokens each sequence's cache holds while decoding"
    )
    p.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None, help="default: bfloat16 on cuda")
    p.add_argument("--warmup", type=int, default=5, help="decode steps before the timed ones")
    p.add_argument(
        "--steps", type=int, default=20, help="timed decode steps a batch size (the median counts)"
    )
    p.add_argument("--eager", action="store_true", help="no CUDA graphs at any degree")
    p.add_argument(
        "--tp-eager", action="store_true", help="TP>1 decodes eagerly (its all-reduces outside graphs)"
    )
    p.add_argument(
        "--allreduce",
        choices=ALLREDUCE,
        default="nccl",
        help="TP>1's all-reduce: NCCL, or a one-shot through symmetric memory on CUDA (`TPGroup`)",
    )
    p.add_argument(
        "--timeout", type=float, default=1800, help="seconds a degree may take before it is killed"
    )
    p.add_argument("--out", default="runs/tp")
    args = p.parse_args(argv)
    args.model = args.model or ("qwen2.5-7b" if args.device == "cuda" else "tiny")
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.warmup < 1 or args.steps < 1 or min(args.batch_sizes) < 1 or args.context < 1:
        p.error("--warmup, --steps, --batch-sizes and --context must be >= 1")
    cfg = model_config(args.model)
    for n in args.tp:
        try:
            check_degree(cfg, n)
        except ValueError as e:
            p.error(f"--tp {n}: {e}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            p.error("--device cuda but torch.cuda.is_available() is False; use --device cpu")
        if torch.cuda.device_count() < max(args.tp):
            p.error(f"--tp {max(args.tp)} needs {max(args.tp)} GPUs; {torch.cuda.device_count()} visible")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    cfg = model_config(args.model)
    s = {
        k: getattr(args, k)
        for k in (
            "model",
            "device",
            "dtype",
            "batch_sizes",
            "context",
            "warmup",
            "steps",
            "eager",
            "tp_eager",
            "allreduce",
        )
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    elem = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    degrees, rows = [], []
    for n in args.tp:
        print(f"[tp={n}] {args.model} on {n} {args.device} rank(s)", flush=True)
        report = run_degree(n, s, args.timeout)
        if report.get("error"):
            print(f"[tp={n}] failed: {report['error']}", flush=True)
        rows += finish_rows(report, cfg.hidden_size * elem)
        degrees.append({k: v for k, v in report.items() if k != "rows"})
    names = [d["device_name"] for d in degrees if "device_name" in d]
    result = {
        "meta": {
            "device": args.device,
            "device_name": names[0] if names else args.device,
            "device_count": torch.cuda.device_count() if args.device == "cuda" else 0,
            "command": "laminar bench tp " + shlex.join(argv),
            "torch": torch.__version__,
            "commit": git_commit(),
            "code": code_digest(),
            "dtype": args.dtype,
            "block_size": BLOCK_SIZE,
            "warmup": args.warmup,
            "steps": args.steps,
            "eager": args.eager,
            "tp_eager": args.tp_eager,
            "allreduce": args.allreduce,
        },
        "model": args.model,
        "shape": {
            k: getattr(cfg, k)
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_layers",
                "num_heads",
                "num_kv_heads",
                "head_dim",
                "vocab_size",
                "qkv_bias",
                "tie_word_embeddings",
            )
        },
        "context": args.context,
        "degrees": degrees,
        "rows": rows,
    }
    (out / "tp.json").write_text(json.dumps(result, indent=1))
    table = markdown(result)
    (out / "tp.md").write_text(table)
    drawn = plot(result, out / "tp.png")
    print(table)
    print(
        f"wrote {out / 'tp.json'}, {out / 'tp.md'}"
        + (f", {out / 'tp.png'}" if drawn else " (no matplotlib: no plot)")
    )
    return 1 if any(d.get("error") for d in degrees) else 0
