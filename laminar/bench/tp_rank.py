"""What each rank of `laminar bench tp` runs (`tensor_parallel.py` spawns the ranks and reports): build its
shard of a random-weight engine, fill the cache by prefill, time decode steps in lockstep with the other ranks
(and their all-reduces), and the sizes the roofline is made of."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from laminar.bench.engine import measure_bandwidth, sync
from laminar.engine.config import ModelConfig, SamplingParams
from laminar.engine.engine import Engine
from laminar.engine.model_runner import ModelRunner
from laminar.engine.random_model import model_config
from laminar.engine.tensor_parallel import TPGroup, local_config

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
