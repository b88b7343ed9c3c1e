"""`laminar bench engine`: decode throughput by batch size against Hugging Face `generate`, the memory roofline,
and B, the batch size past which doubling the batch adds less than 10% throughput (the repack planner needs it).
With `--speculation off,on`: tokens/s with grouped speculative decoding off and on instead
(`laminar/bench/speculation.py`).

Both sides run the same random model (the engine gets the HF model's state dict), the same prompt length and the
same number of new tokens, sampling at temperature 1 with EOS ignored.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from pathlib import Path

import torch

from laminar.engine.config import ModelConfig, SamplingParams
from laminar.engine.engine import Engine
from laminar.engine.random_model import SHAPES, shape_config
from laminar.telemetry.provenance import code_digest


def time_in_graph(fn, calls: int, reps: int = 20) -> float:
    """Microseconds a call, for `fn` making `calls` calls (a kernel per layer, say) captured as one CUDA graph
    and replayed `reps` times: the kernels back to back as the engine's decode graphs run them, with no Python
    launch cost between them (which would bury small kernels' differences)."""
    for _ in range(2):  # compile and warm up outside the capture
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps / calls


def build_hf_model(name: str, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    if name in SHAPES:
        cfg = shape_config(name)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype).to(device)
    return model.eval().requires_grad_(False)


def measure_bandwidth(device: str) -> float:
    """Bytes read plus written per second by a large device copy (the roofline's denominator): the fastest of
    ten, as the best the memory gives (a median let one slow stretch move the roofline: one probe read 2.45
    TB/s where the same card gave 2.92-2.94 in the runs before and after)."""
    n = (1 << 30) if device == "cuda" else (1 << 28)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t)
    del src, dst
    return 2 * n / min(times[2:])


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bench_engine(
    engine: Engine, batch: int, prompt_len: int, new_tokens: int, vocab: int, seed: int, profile: bool = False
) -> dict:
    """Decode `new_tokens` for `batch` requests; with `profile`, also look inside the step halfway through (at
    the mean context): its CUDA graph replayed alone, and its kernels by name."""
    g = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    for i in range(batch):
        prompt = torch.randint(10, vocab, (prompt_len,), generator=g).tolist()
        engine.add_request(f"{seed}-{i}", prompt, SamplingParams(**{**params.__dict__, "seed": i}))
    prefill_s = decode_s = 0.0
    decode_steps = decode_tokens = 0
    looked = None
    start = time.perf_counter()
    while engine.has_unfinished():
        if profile and looked is None and decode_steps == new_tokens // 2:
            looked = look_inside_step(engine, batch)
        t = time.perf_counter()
        out = engine.step()
        dt = time.perf_counter() - t
        if out.is_prefill:
            prefill_s += dt
        else:
            decode_s += dt
            decode_steps += 1
            decode_tokens += len(out.new_tokens)
    total = time.perf_counter() - start
    return {
        **({"inside_step": looked} if looked else {}),
        "batch": batch,
        "decode_tokens_per_s": decode_tokens / decode_s,
        "e2e_tokens_per_s": batch * new_tokens / total,
        "decode_step_ms": 1e3 * decode_s / decode_steps,
        "prefill_s": prefill_s,
        "total_s": total,
    }


def look_inside_step(engine: Engine, batch: int, steps: int = 5) -> dict:
    """Where a decode step's time goes: the step as `Engine.step` runs it, its CUDA graph replayed alone (the
    device's share), the host's busy time a step (the step less its wait for the device's tokens), and the device
    time of each kernel name per step (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    runner = engine.runner
    graph_bs = runner._graph_size(batch) if runner.device.type == "cuda" else 0
    out: dict = {"graph_batch": graph_bs}
    if graph_bs:
        engine._drain()  # no step in flight while its graph is replayed alone
        graph = runner.graphs[graph_bs][0]
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            graph.replay()  # same inputs each time: rewrites one KV slot, reads the same context
        torch.cuda.synchronize()
        out["graph_replay_ms"] = 1e3 * (time.perf_counter() - t) / 20
    # the host's share: each step's time less what it spent waiting for the device's tokens
    waited, collect = 0.0, runner.collect

    def timed_collect(step):
        nonlocal waited
        t = time.perf_counter()
        got = collect(step)
        waited += time.perf_counter() - t
        return got

    runner.collect = timed_collect
    t = time.perf_counter()
    for _ in range(4 * steps):
        engine.step()
    elapsed = time.perf_counter() - t
    del runner.collect  # the class's own again
    out["timed_step_ms"] = 1e3 * elapsed / (4 * steps)
    out["host_busy_ms"] = 1e3 * (elapsed - waited) / (4 * steps)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runner.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync(runner.device.type)
        out["profiled_step_ms"] = 1e3 * (time.perf_counter() - t) / steps
    kernels = {}
    for evt in prof.key_averages():
        dev_us = getattr(evt, "self_device_time_total", 0) or getattr(evt, "self_cuda_time_total", 0)
        if dev_us > 0 and evt.device_type.name == "CUDA":
            kernels[evt.key] = {"us_per_step": dev_us / steps, "calls_per_step": evt.count / steps}
    top = sorted(kernels.items(), key=lambda kv: -kv[1]["us_per_step"])
    out["device_us_per_step"] = sum(k["us_per_step"] for k in kernels.values())
    out["kernels"] = [{"name": k[:120], **v} for k, v in top[:40]]
    return out


def bench_hf(model, batch: int, prompt_len: int, new_tokens: int, vocab: int, device: str) -> dict:
    g = torch.Generator().manual_seed(batch)
    ids = torch.randint(10, vocab, (batch, prompt_len), generator=g).to(device)
    kw = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        pad_token_id=0,
    )
    with torch.inference_mode():
        sync(device)
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        sync(device)
        total = time.perf_counter() - t
    assert out.shape[1] == prompt_len + new_tokens
    return {"batch": batch, "e2e_tokens_per_s": batch * new_tokens / total, "total_s": total}


def print_inside(name: str, batch: int, step_ms: float, inside: dict) -> None:
    print(
        f"[{name}] inside a decode step at batch {batch}: step {step_ms:.3f} ms, graph replayed alone "
        f"{inside.get('graph_replay_ms', float('nan')):.3f} ms, kernels {inside['device_us_per_step']:.0f} us, "
        f"the host busy {inside['host_busy_ms']:.3f} ms of a {inside['timed_step_ms']:.3f} ms step",
        flush=True,
    )
    for k in inside["kernels"][:25]:
        print(f"    {k['us_per_step']:8.1f} us  x{k['calls_per_step']:5.1f}  {k['name']}", flush=True)


def knee(rows: list[dict], key: str = "decode_tokens_per_s") -> int:
    """The batch size past which doubling adds less than 10% throughput."""
    by_batch = {r["batch"]: r[key] for r in rows}
    for b in sorted(by_batch):
        if 2 * b in by_batch and by_batch[2 * b] < 1.1 * by_batch[b]:
            return b
    return max(by_batch)


def run_model(name: str, args, device: str, dtype: torch.dtype, bandwidth: float) -> dict:
    hf = build_hf_model(name, device, dtype)
    cfg = ModelConfig.from_hf(hf.config)
    max_len = args.prompt_len + args.new_tokens
    block_size = 16
    blocks_per_seq = -(-(max_len + 1) // block_size)
    t = time.perf_counter()
    engine = Engine(
        cfg,
        weights=hf.state_dict(),
        device=device,
        dtype=dtype,
        max_num_seqs=max(args.batch_sizes),
        num_kv_blocks=max(args.batch_sizes) * blocks_per_seq + 8,
        block_size=block_size,
        max_model_len=max_len + 16,
        pipeline=False if args.step_by_step else None,
    )
    setup_s = time.perf_counter() - t
    print(
        f"[{name}] engine ready in {setup_s:.1f}s (CUDA graphs: {sorted(engine.runner.graphs)})", flush=True
    )
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    # the embedding table is read only at B rows; when untied it is not part of the per-step stream
    if not cfg.tie_word_embeddings:
        weight_bytes -= (
            engine.runner.model.model.embed_tokens.weight.numel() * engine.runner.k_cache.element_size()
        )
    kv_per_token = engine.runner.kv_bytes_per_block(cfg, 1, dtype)

    bench_engine(
        engine, min(4, max(args.batch_sizes)), args.prompt_len, 16, cfg.vocab_size, seed=999
    )  # warm up
    rows = []
    for b in args.batch_sizes:
        r = bench_engine(
            engine, b, args.prompt_len, args.new_tokens, cfg.vocab_size, seed=b, profile=b in args.profile
        )
        mean_ctx = args.prompt_len + args.new_tokens / 2
        roof_bytes = weight_bytes + b * mean_ctx * kv_per_token
        r["roofline_bytes_per_step"] = roof_bytes
        r["roofline_step_ms"] = 1e3 * roof_bytes / bandwidth
        r["step_over_roofline"] = r["decode_step_ms"] / r["roofline_step_ms"]
        r["preemptions"] = engine.stats().num_preemptions
        rows.append(r)
        if "inside_step" in r:
            print_inside(name, b, r["decode_step_ms"], r["inside_step"])
        print(
            f"[{name}] engine batch {b:4d}: decode {r['decode_tokens_per_s']:9.0f} tok/s  e2e "
            f"{r['e2e_tokens_per_s']:9.0f} tok/s  step {r['decode_step_ms']:7.2f} ms  roofline "
            f"{r['roofline_step_ms']:6.2f} ms (x{r['step_over_roofline']:.2f})",
            flush=True,
        )
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()

    hf_rows = []
    for b in args.hf_batch_sizes or []:
        r = bench_hf(hf, b, args.prompt_len, args.new_tokens, cfg.vocab_size, device)
        hf_rows.append(r)
        print(
            f"[{name}] HF generate batch {b:4d}: {r['e2e_tokens_per_s']:9.0f} tok/s ({r['total_s']:.1f}s)",
            flush=True,
        )
    del hf
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()

    eng = {r["batch"]: r for r in rows}
    speedup = {
        str(h["batch"]): eng[h["batch"]]["e2e_tokens_per_s"] / h["e2e_tokens_per_s"]
        for h in hf_rows
        if h["batch"] in eng
    }
    return {
        "model": name,
        "shape": {
            k: getattr(cfg, k)
            for k in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size")
        },
        "weight_bytes_per_step": weight_bytes,
        "kv_bytes_per_token": kv_per_token,
        "engine": rows,
        "hf_generate": hf_rows,
        "speedup_e2e_vs_hf": speedup,
        "B": knee(rows),
        "engine_setup_s": setup_s,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="laminar bench engine", description=__doc__)
    p.add_argument(
        "--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--out", default="runs/engine")
    p.add_argument("--model", nargs="+", default=None, help=f"{sorted(SHAPES)} or a local HF directory")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    p.add_argument(
        "--hf-batch-sizes", type=int, nargs="*", default=None, help="default: the same as --batch-sizes"
    )
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=None, help="default: 1024 on cuda, 128 on cpu")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None)
    p.add_argument(
        "--profile",
        type=int,
        nargs="*",
        default=[],
        help="batch sizes whose decode step is also looked inside (graph replay alone, kernels by name)",
    )
    p.add_argument(
        "--step-by-step",
        action="store_true",
        help="each decode step waits for the last one's tokens (the engine's pipelining off)",
    )
    spec = p.add_argument_group(
        "speculation",
        "with --speculation: tokens/s with it off and on instead (laminar/bench/speculation.py)",
    )
    spec.add_argument("--speculation", default=None, help="modes to compare, e.g. off,on or off,auto,on")
    spec.add_argument("--task", default="arith", help="whose held-out prompts (the model's chat template)")
    spec.add_argument("--group-size", type=int, default=8)
    spec.add_argument("--temperature", type=float, default=1.0)
    spec.add_argument("--top-p", type=float, default=1.0)
    spec.add_argument("--max-draft", type=int, default=8, help="rollout.speculation_max_draft")
    spec.add_argument(
        "--workload",
        choices=["groups", "tail"],
        default="groups",
        help="groups: a group's samples start together; tail: each group's last sample, its siblings finished",
    )
    spec.add_argument(
        "--repeats", type=int, default=1, help="runs of each mode, interleaved; the median's row"
    )
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if args.speculation is not None:
        from laminar.bench.speculation import run_speculation

        if not args.model:
            p.error(
                "--speculation needs --model DIR (a real model: random weights give no text to draft from)"
            )
        args.batch_sizes = args.batch_sizes or [1, 4, 16, 64]
        args.new_tokens = args.new_tokens or (512 if cuda else 64)
        dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
        run_speculation(args, args.device, dtype, argv)
        return 0
    args.model = args.model or (["qwen2.5-0.5b"] if cuda else ["tiny"])
    args.batch_sizes = args.batch_sizes or (
        [1, 2, 4, 8, 16, 32, 64, 128, 256] if cuda else [1, 4, 16, 32, 64]
    )
    if args.hf_batch_sizes is None:
        args.hf_batch_sizes = args.batch_sizes
    args.new_tokens = args.new_tokens or (1024 if cuda else 128)
    dtype = getattr(torch, args.dtype or ("bfloat16" if cuda else "float32"))
    bandwidth = measure_bandwidth(args.device)
    device_name = (
        torch.cuda.get_device_name() if cuda else f"{platform.processor() or platform.machine()} CPU"
    )
    print(f"device {device_name}: copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    result = {
        "device": args.device,
        "device_name": device_name,
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "code": code_digest(),
        "dtype": str(dtype).removeprefix("torch."),
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "bandwidth_bytes_per_s": bandwidth,
        "command": "laminar bench engine " + " ".join(argv),
        "pipelined": not args.step_by_step,
        "runs": [],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"engine-{args.device}.json"
    for name in args.model:
        result["runs"].append(run_model(name, args, args.device, dtype, bandwidth))
        path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    for run in result["runs"]:
        print(f"{run['model']}: B = {run['B']}, speedup vs HF generate (e2e) {run['speedup_e2e_vs_hf']}")
    return 0
