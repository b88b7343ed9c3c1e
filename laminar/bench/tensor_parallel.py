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
import os
import platform
import shlex
import socket
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from laminar.bench.engine import measure_bandwidth, sync
from laminar.engine.config import ModelConfig, SamplingParams
from laminar.engine.engine import Engine
from laminar.engine.model_runner import ModelRunner
from laminar.engine.random_model import SHAPES, model_config
from laminar.engine.tensor_parallel import ALLREDUCE, TPGroup, check_degree, local_config
from laminar.telemetry.provenance import code_digest

BLOCK_SIZE = 16
# GPU memory a rank keeps free beyond weights and cache: activations, prefill chunks, graph pools, compiler
# workspace (the engine's own estimate keeps 2 GiB plus a step's logits)
RESERVE_BYTES = 4 << 30
SEED = 0
ALLREDUCE_STEPS = 3  # decode steps after the timed ones whose all-reduces are timed (several ranks only)


@dataclass
class AllReduceClock:
    """Time spent inside all-reduces while `on`: CUDA events around each (read after a sync, so the step is not
    slowed by waiting), or wall time on CPU, where gloo's all-reduce returns when it is done."""

    cuda: bool
    on: bool = False
    calls: int = 0
    seconds: float = 0.0
    events: list = field(default_factory=list)

    def total_s(self) -> float:
        """Seconds inside all-reduces since the clock was last reset."""
        if not self.cuda:
            return self.seconds
        torch.cuda.synchronize()
        return sum(a.elapsed_time(b) for a, b in self.events) / 1e3

    def reset(self) -> None:
        self.calls, self.seconds, self.events = 0, 0.0, []


@dataclass(frozen=True)
class TimedTPGroup(TPGroup):
    """A `TPGroup` whose all-reduces `clock` times while it is on. The time includes waiting for the slowest
    rank to arrive, so it bounds the communication's cost from above."""

    clock: AllReduceClock | None = field(default=None, compare=False)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        c = self.clock
        if c is None or not c.on:
            return super().all_reduce(x)
        c.calls += 1
        if c.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            super().all_reduce(x)
            end.record()
            c.events.append((start, end))
            return x
        t = time.perf_counter()
        super().all_reduce(x)
        c.seconds += time.perf_counter() - t
        return x


# ---- sizes --------------------------------------------------------------------------------------------------
def parse_degrees(text: str) -> list[int]:
    """`--tp 1,2,4` as [1, 2, 4]."""
    try:
        degrees = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tp {text!r}: expected degrees such as 1,2") from None
    if not degrees or min(degrees) < 1:
        raise argparse.ArgumentTypeError(f"--tp {text!r}: expected degrees >= 1 such as 1,2")
    return degrees


def estimated_weight_bytes(cfg: ModelConfig, elem: int) -> int:
    """Bytes of one rank's parameters for `cfg`, its shard's shape (both embedding tables when untied): what
    the engine allocates before any cache, for deciding which batches fit."""
    attn = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    layer = attn + 3 * cfg.hidden_size * cfg.intermediate_size + 2 * cfg.hidden_size
    tables = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    return elem * (tables + cfg.num_layers * layer + cfg.hidden_size)


def embedding_bytes(engine: Engine) -> int:
    emb = engine.runner.model.model.embed_tokens.weight
    return emb.numel() * emb.element_size()


def roofline_weight_bytes(engine: Engine) -> int:
    """Bytes of weights one decode step reads on this rank: every parameter it holds, less an untied embedding
    table, of which a step gathers only its batch's rows (counted per batch in `roofline`)."""
    total = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    return total if engine.config.tie_word_embeddings else total - embedding_bytes(engine)


def roofline(weight_bytes: int, kv_per_token: int, hidden_bytes: int, batch: int, context: float, bw: float):
    """(bytes, seconds) one GPU must read for a decode step of `batch` sequences reading `context` tokens each:
    its weights, its batch's embedding rows, and its share of their keys and values."""
    total = weight_bytes + batch * hidden_bytes + batch * context * kv_per_token
    return total, total / bw


def prompt_len(context: int, warmup: int, steps: int) -> int:
    """The prompt each sequence prefills, so that the timed decode steps read `context` tokens on average: the
    cache grows by one token a step through the warm-up and the timed steps."""
    return max(1, context - warmup - (steps + 1) // 2)


def new_tokens(s: dict) -> int:
    """Tokens each request samples: prefill's, the warm-up's, the timed steps', the all-reduce steps', and one
    more so that no request ends before the last measured step."""
    return 1 + s["warmup"] + s["steps"] + ALLREDUCE_STEPS + 1


# ---- what each rank runs ------------------------------------------------------------------------------------
def init_rank(rank: int, world: int, port: int, device: str) -> torch.device:
    """Join the process group of this degree: NCCL with GPU `rank` on CUDA (one host, so rank = local rank),
    gloo on CPU, with the host's cores shared between the ranks."""
    if device == "cuda":
        dev = torch.device("cuda", rank)
        torch.cuda.set_device(dev)
        backend, kw = "nccl", {"device_id": dev}
    else:
        dev, backend, kw = torch.device("cpu"), "gloo", {}
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(minutes=10),
        **kw,
    )
    return dev


def agreed_min(n: int, dev: torch.device) -> int:
    """The least of every rank's `n`, on every rank (so all ranks take the same decisions)."""
    t = torch.tensor([n], dtype=torch.int64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def fitting_batches(s: dict, shard: ModelConfig, dtype: torch.dtype, dev: torch.device, seq_blocks: int):
    """(batch sizes whose weights, cache and reserve fit in every rank's free GPU memory, skipped ones with the
    reason). On CPU every batch is taken."""
    batches = sorted(s["batch_sizes"])
    if dev.type != "cuda":
        return batches, []
    free = agreed_min(torch.cuda.mem_get_info(dev)[0], dev)
    elem = torch.empty((), dtype=dtype).element_size()
    weights = estimated_weight_bytes(shard, elem)
    per_seq = seq_blocks * ModelRunner.kv_bytes_per_block(shard, BLOCK_SIZE, dtype)
    fits, skipped = [], []
    for b in batches:
        need = weights + b * per_seq + RESERVE_BYTES + b * shard.vocab_size * 4 * 3
        if need <= free:
            fits.append(b)
        else:
            skipped.append(
                {
                    "batch": b,
                    "reason": f"needs {need / 2**30:.1f} GiB a GPU (weights {weights / 2**30:.1f}, cache "
                    f"{b * per_seq / 2**30:.1f}, reserve); {free / 2**30:.1f} GiB free",
                }
            )
    return fits, skipped


def fill(engine: Engine, batch: int, prompt: int, new_tokens: int, vocab: int) -> None:
    """Add `batch` requests of `prompt` random tokens (the same on every rank: seeded by the batch size) and
    step through their prefill, up to and including the first decode step of all of them."""
    g = torch.Generator().manual_seed(batch)
    for i in range(batch):
        ids = torch.randint(10, vocab, (prompt,), generator=g).tolist()
        params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True, seed=i)
        engine.add_request(f"{batch}-{i}", ids, params)
    while True:
        out = engine.step()
        if not out.is_prefill:
            break
    if out.num_tokens != batch:
        raise RuntimeError(f"batch {batch}: the first decode step ran {out.num_tokens} rows (blocks short?)")


def timed_steps(engine: Engine, n: int, device: str) -> list[float]:
    """Seconds of each of `n` decode steps, as `Engine.step` runs them: with pipelining, one step's return
    is the steady state of the device finishing one step while the next is queued."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        out = engine.step()
        times.append(time.perf_counter() - t)
        assert not out.is_prefill
    sync(device)
    return times


def bench_batch(engine: Engine, tp: TimedTPGroup | None, batch: int, s: dict, prompt: int) -> dict:
    """One batch size: fill, warm up, time `steps` decode steps, then (with several ranks) time the
    all-reduces of a few more, then let the requests finish."""
    fill(engine, batch, prompt, new_tokens(s), engine.config.vocab_size)
    for _ in range(s["warmup"] - 1):  # the first decode step was `fill`'s last
        engine.step()
    sync(s["device"])
    dist.barrier()
    times = timed_steps(engine, s["steps"], s["device"])
    row = {"batch": batch, "step_ms_all": [1e3 * t for t in times], "step_ms": 1e3 * statistics.median(times)}
    if tp is not None and not engine.runner.graphs:  # a graph's replay calls no all_reduce to time
        clock = tp.clock
        clock.reset()
        clock.on = True
        for _ in range(ALLREDUCE_STEPS):
            engine.step()
        clock.on = False
        row["allreduce_ms"] = 1e3 * clock.total_s() / ALLREDUCE_STEPS
        row["allreduce_calls_per_step"] = clock.calls / ALLREDUCE_STEPS
    while engine.has_unfinished():
        engine.step()
    return row


def build_engine(
    s: dict, cfg: ModelConfig, tp: TimedTPGroup | None, dev: torch.device, max_batch: int, seq_len: int
):
    """The engine with its random initialisation, the same on every rank (one seed): each rank builds only its
    shard, and the replicated embedding, norms and lm_head agree between the ranks, as loaded weights would."""
    torch.manual_seed(SEED)
    blocks = -(-seq_len // BLOCK_SIZE)
    return Engine(
        cfg,
        device=dev,
        dtype=getattr(torch, s["dtype"]),
        max_num_seqs=max_batch,
        num_kv_blocks=max_batch * blocks + 1,
        block_size=BLOCK_SIZE,
        max_model_len=blocks * BLOCK_SIZE,
        use_cuda_graphs=not s["eager"],
        share_prompts=False,
        tensor_parallel=tp,
    )


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"{platform.processor() or platform.machine()} CPU"


def run_rank(rank: int, world: int, s: dict) -> dict | None:
    """This rank's part of one degree; rank 0's report (the others return None)."""
    dev = init_rank(rank, world, s["port"], s["device"])
    cfg = model_config(s["model"])
    shard = local_config(cfg, world)
    dtype = getattr(torch, s["dtype"])
    report = {"tp": world, "device_name": device_name(dev)}
    if rank == 0:
        report["bandwidth_bytes_per_s"] = measure_bandwidth(s["device"])
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    prompt = prompt_len(s["context"], s["warmup"], s["steps"])
    seq_len = prompt + new_tokens(s)
    batches, skipped = fitting_batches(s, shard, dtype, dev, -(-seq_len // BLOCK_SIZE))
    report["skipped"] = skipped
    report["rows"] = []
    if not batches:
        return report if rank == 0 else None
    clock = AllReduceClock(cuda=dev.type == "cuda")
    tp = (
        TimedTPGroup(rank, world, graphs=not s["tp_eager"], allreduce=s.get("allreduce", "nccl"), clock=clock)
        if world > 1
        else None
    )
    t = time.perf_counter()
    engine = build_engine(s, cfg, tp, dev, max(batches), seq_len)
    report.update(
        setup_s=time.perf_counter() - t,
        cuda_graph_sizes=sorted(engine.runner.graphs),
        pipelined=engine.pipeline,
        weight_bytes_per_rank=roofline_weight_bytes(engine),
        embedding_table_bytes_not_counted=0 if cfg.tie_word_embeddings else embedding_bytes(engine),
        kv_bytes_per_token_per_rank=ModelRunner.kv_bytes_per_block(shard, 1, dtype),
        kv_heads_per_rank=shard.num_kv_heads,
        prompt_len=prompt,
    )
    for b in batches:
        row = bench_batch(engine, tp, b, s, prompt)
        row["mean_context"] = prompt + s["warmup"] + (s["steps"] + 1) / 2
        report["rows"].append(row)
        if rank == 0:
            print(f"[tp={world}] batch {b:4d}: step {row['step_ms']:8.3f} ms", flush=True)
    return report if rank == 0 else None


def rank_main(rank: int, world: int, s: dict, out: str) -> None:
    """Entry of each spawned process: run, write rank 0's report to `out`, leave the group."""
    try:
        report = run_rank(rank, world, s)
        if report is not None:
            Path(out).write_text(json.dumps(report))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


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
