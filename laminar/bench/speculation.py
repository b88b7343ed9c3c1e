"""`laminar bench engine --speculation off,on`: one engine's tokens/s at each batch size with grouped speculative
decoding off and on, over groups of samples of a task's held-out prompts (a real model's text: random weights
have no group structure to draft from).

At batch B the engine runs at most B requests at once over ceil(B / group_size) groups (at batch 1 a group's
samples run one after another, the tail's case: later ones draft from the finished). Every mode gets the same
prompts, seeds and engine shape, and samples the same tokens (speculation changes only how many steps they
take), so tokens/s compare directly; `same_tokens_as_first` counts the requests whose tokens equal the first
mode's. Each engine is warmed up on other prompts first. Writes `DIR/engine-speculation-DEVICE.json`.
"""

from __future__ import annotations

import gc
import math
import time
from pathlib import Path
from typing import Any

import torch

from laminar.engine.config import SamplingParams, Speculation
from laminar.engine.engine import Engine
from laminar.jsonio import write_json
from laminar.telemetry.provenance import code_digest


def task_prompts(model_dir: str, task: str) -> tuple[list[list[int]], tuple[int, ...]]:
    """The task's held-out prompts encoded as a run would encode them (the model's chat template), and the
    model's end tokens."""
    from laminar.configure import load_config
    from laminar.data.codec import TaskCodec
    from laminar.tasks.rows import held_out_rows

    cfg = load_config(None, [f"task.name={task}", "eval.num_prompts=512"])
    rows = held_out_rows(cfg)
    if not rows:
        raise ValueError(f"task {task!r} has no held-out prompts; give a task that has (e.g. arith, chain)")
    codec = TaskCodec.from_config(model_dir, cfg)
    return [codec.encode_prompt(r["prompt"]) for r in rows], codec.end_ids


def run_batch(engine: Engine, prompts: list[list[int]], group_size: int, params: SamplingParams) -> dict:
    """Every sample of every prompt (seeds 0..group_size-1), to the end; throughput and the engine's counters."""
    before = engine.stats()
    for g, prompt in enumerate(prompts):
        for i in range(group_size):
            engine.add_request(f"g{g}-{i}", prompt, SamplingParams(**{**params.__dict__, "seed": i}))
    done: dict[str, list[int]] = {}
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    while engine.has_unfinished():
        for f in engine.step().finished:
            done[f.request_id] = f.output_token_ids
    wall = time.perf_counter() - start
    s = engine.stats()
    tokens = sum(len(t) for t in done.values())
    drafted, rows = s.draft_tokens - before.draft_tokens, s.draft_rows - before.draft_rows
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "decode_steps": s.decode_steps - before.decode_steps,
        "verify_steps": s.verify_steps - before.verify_steps,
        "draft_tokens": drafted,
        "accepted_tokens": s.accepted_tokens - before.accepted_tokens,
        "acceptance": (s.accepted_tokens - before.accepted_tokens) / drafted if drafted else None,
        "tokens_per_verify": (s.verify_tokens - before.verify_tokens) / rows if rows else None,
        "draft_s": s.draft_s - before.draft_s,
        # auto's gate: this batch's decode steps by its decision; its ms an emitted token per path and batch range
        "gate_steps": {k: n - before.gate_steps.get(k, 0) for k, n in s.gate_steps.items()},
        "gate_ms_per_token": s.gate_ms_per_token,
        "outputs": done,
    }


def run_speculation(args: Any, device: str, dtype: torch.dtype, argv: list[str]) -> dict:
    modes = args.speculation.split(",")
    for m in modes:
        Speculation(m)  # a bad name fails before any model loads
    model = args.model[0]
    if not Path(model).is_dir():
        raise ValueError(f"--speculation needs a local model directory (--model DIR), got {model!r}")
    prompts, end_ids = task_prompts(model, args.task)
    warm, prompts = prompts[:2], prompts[2:]
    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.new_tokens, stop_token_ids=end_ids
    )
    longest = max(len(p) for p in prompts) + args.new_tokens + args.max_draft + 1
    result: dict[str, Any] = {
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else "CPU",
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "code": code_digest(),
        "command": "laminar bench engine " + " ".join(argv),
        "model": model,
        "task": args.task,
        "dtype": str(dtype).removeprefix("torch."),
        "group_size": args.group_size,
        "sampling": {"temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.new_tokens},
        "max_draft": args.max_draft,
        "rows": [],
    }
    path = Path(args.out) / f"engine-speculation-{device}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for batch in args.batch_sizes:
        groups = prompts[: math.ceil(batch / args.group_size)]
        first: dict[str, list[int]] | None = None
        for mode in modes:
            engine = Engine.from_pretrained(
                model,
                eos_token_ids=end_ids,
                device=device,
                dtype=dtype,
                max_num_seqs=batch,
                num_kv_blocks=len(groups) * args.group_size * -(-longest // 16) + 16,
                max_model_len=longest + 16,
                use_cuda_graphs=device == "cuda",
                speculation=Speculation(mode, max_draft=args.max_draft),
            )
            run_batch(engine, warm, 1, SamplingParams(**{**params.__dict__, "max_new_tokens": 16}))  # warm up
            row = run_batch(engine, groups, args.group_size, params)
            outputs = row.pop("outputs")
            first = first or outputs
            row.update(batch=batch, mode=mode, groups=len(groups))
            row["same_tokens_as_first"] = f"{sum(outputs[k] == first[k] for k in first)}/{len(first)}"
            result["rows"].append(row)
            acc = "" if row["acceptance"] is None else f", acceptance {row['acceptance']:.2f}"
            tpv = (
                "" if row["tokens_per_verify"] is None else f", {row['tokens_per_verify']:.2f} tokens/verify"
            )
            gate = {k: n for k, n in row["gate_steps"].items() if n} if mode == "auto" else {}
            print(
                f"batch {batch:3d} speculation {mode:4s}: {row['tokens_per_s']:8.1f} tokens/s ({row['tokens']} "
                f"tokens, {row['decode_steps']} decode steps{acc}{tpv}, same tokens {row['same_tokens_as_first']})"
                + (f"; gate steps {gate}, ms a token {row['gate_ms_per_token']}" if gate else ""),
                flush=True,
            )
            del engine
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        write_json(path, result)
    base = {r["batch"]: r["tokens_per_s"] for r in result["rows"] if r["mode"] == modes[0]}
    result["speedup"] = {
        f"{r['batch']}/{r['mode']}": r["tokens_per_s"] / base[r["batch"]]
        for r in result["rows"]
        if r["mode"] != modes[0]
    }
    write_json(path, result)
    print(f"wrote {path}; tokens/s against {modes[0]}: {result['speedup']}")
    return result
