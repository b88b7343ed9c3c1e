"""`laminar bench engine --speculation off,on`: one engine's tokens/s at each batch size with grouped speculative
decoding off and on, over groups of samples of a task's held-out prompts (a real model's text: random weights
have no group structure to draft from).

Two workloads (`--workload`):
- `groups`: at batch B the engine runs at most B requests at once over ceil(B / group_size) groups, all samples of
  a group started together (at batch 1 a group's samples run one after another: later ones draft from the
  finished).
- `tail`: what a replica holds after repack, B requests of B groups whose other group_size - 1 samples have
  finished elsewhere: those siblings are generated first (untimed, once per batch size, without speculation),
  then each group's last sample arrives as a repack moves it, carrying its group's text
  (`ExportedRequest.group_text`), and the B run at once, timed.

Every mode gets the same prompts, seeds and engine shape, and samples the same tokens (speculation changes only
how many steps they take), so tokens/s compare directly; `same_tokens_as_first` counts the requests whose tokens
equal the first mode's. Each engine is warmed up on other prompts first. With `--repeats N` the modes run N times
each, interleaved (off, on, off, on, ...), and a row holds the median run's numbers and every run's tokens/s.
Writes `DIR/engine-speculation-DEVICE.json` (`-tail` before the suffix for the tail workload).
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
from laminar.engine.sequence import ExportedRequest
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


def seeded(params: SamplingParams, seed: int) -> SamplingParams:
    return SamplingParams(**{**params.__dict__, "seed": seed})


def outputs_to_the_end(engine: Engine) -> dict[str, list[int]]:
    """Step until every request has finished; their output tokens by request id."""
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for f in engine.step().finished:
            done[f.request_id] = f.output_token_ids
    return done


def run_batch(
    engine: Engine,
    prompts: list[list[int]],
    group_size: int,
    params: SamplingParams,
    siblings: list[list[list[int]]] | None = None,
) -> dict:
    """Every sample of every prompt (seeds 0..group_size-1), to the end; throughput and the engine's counters.
    With `siblings` (per prompt, the outputs of its samples 0..group_size-2): only the last sample of each,
    imported as a moved request that brings its siblings' text."""
    before = engine.stats()
    for g, prompt in enumerate(prompts):
        if siblings is None:
            for i in range(group_size):
                engine.add_request(f"g{g}-{i}", prompt, seeded(params, i))
            continue
        engine.import_request(
            ExportedRequest(
                request_id=f"g{g}-{group_size - 1}",
                prompt_token_ids=prompt,
                output_token_ids=[],
                logprobs=[],
                token_versions=[],
                params=seeded(params, group_size - 1),
                version=engine.version,
                group_text=siblings[g],
            )
        )
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    done = outputs_to_the_end(engine)
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


def sibling_outputs(
    engine: Engine, prompts: list[list[int]], group_size: int, params: SamplingParams
) -> list[list[list[int]]]:
    """Per prompt, the outputs of its samples 0..group_size-2 (the tail workload's finished siblings)."""
    for g, prompt in enumerate(prompts):
        for i in range(group_size - 1):
            engine.add_request(f"g{g}-{i}", prompt, seeded(params, i))
    done = outputs_to_the_end(engine)
    return [[done[f"g{g}-{i}"] for i in range(group_size - 1)] for g in range(len(prompts))]


def plot_speedups(panels: list[tuple[str, dict]], path: Path) -> bool:
    """One panel a result (`run_speculation`'s, titled by the panel's name): each mode's tokens/s over the first
    mode's against batch size, the median run as a line and every run as a dot, with the targets (2x at
    batch 1-4, 1.5x at 16, 1x past it) dotted; False where matplotlib is missing (a bare GPU image)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), sharey=True, squeeze=False)
    for ax, (title, result) in zip(axes[0], panels):
        modes = list(dict.fromkeys(r["mode"] for r in result["rows"]))
        base = {r["batch"]: r["tokens_per_s"] for r in result["rows"] if r["mode"] == modes[0]}
        batches = sorted(base)
        for i, mode in enumerate(modes[1:], start=1):
            rows = sorted((r for r in result["rows"] if r["mode"] == mode), key=lambda r: r["batch"])
            x = [r["batch"] for r in rows]
            ax.plot(x, [r["tokens_per_s"] / base[r["batch"]] for r in rows], "o-", color=f"C{i}", label=mode)
            for r in rows:
                runs = r.get("tokens_per_s_runs") or [r["tokens_per_s"]]
                ax.plot(
                    [r["batch"]] * len(runs),
                    [t / base[r["batch"]] for t in runs],
                    ".",
                    color=f"C{i}",
                    alpha=0.4,
                )
        targets = [2.0 if b <= 4 else 1.5 if b <= 16 else 1.0 for b in batches]
        ax.plot(batches, targets, ":", color="gray", label="target")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_xlabel("batch (requests at once)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel(f"tokens/s, x {modes[0]}")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def run_speculation(args: Any, device: str, dtype: torch.dtype, argv: list[str]) -> dict:
    modes = args.speculation.split(",")
    tail = args.workload == "tail"
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
        "workload": args.workload,
        "repeats": args.repeats,
        "rows": [],
    }
    path = Path(args.out) / f"engine-speculation{'-tail' if tail else ''}-{device}.json"
    path.parent.mkdir(parents=True, exist_ok=True)

    def engine_for(mode: str, batch: int, requests: int) -> Engine:
        return Engine.from_pretrained(
            model,
            eos_token_ids=end_ids,
            device=device,
            dtype=dtype,
            max_num_seqs=batch,
            num_kv_blocks=requests * -(-longest // 16) + 16,
            max_model_len=longest + 16,
            use_cuda_graphs=device == "cuda",
            speculation=Speculation(mode, max_draft=args.max_draft),
        )

    for batch in args.batch_sizes:
        # tail: at least a group_size of tail requests, at most `batch` at once (at batch 1 one after another)
        groups = (
            prompts[: max(batch, args.group_size)] if tail else prompts[: math.ceil(batch / args.group_size)]
        )
        siblings = None
        if tail:
            maker = engine_for("off", 64, 64)
            siblings = sibling_outputs(maker, groups, args.group_size, params)
            del maker
        requests = len(groups) * (1 if tail else args.group_size)
        engines = {mode: engine_for(mode, batch, requests) for mode in modes}
        for engine in engines.values():
            run_batch(engine, warm, 1, SamplingParams(**{**params.__dict__, "max_new_tokens": 16}))  # warm up
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for _ in range(args.repeats):
            for mode, engine in engines.items():
                runs[mode].append(run_batch(engine, groups, args.group_size, params, siblings))
        first: dict[str, list[int]] | None = None
        for mode in modes:
            ranked = sorted(runs[mode], key=lambda r: r["tokens_per_s"])
            row = dict(ranked[len(ranked) // 2])
            outputs = row.pop("outputs")
            first = first or outputs
            row.update(batch=batch, mode=mode, groups=len(groups))
            row["tokens_per_s_runs"] = [r["tokens_per_s"] for r in runs[mode]]
            same = sum(r["outputs"][k] == first[k] for r in runs[mode] for k in first)
            row["same_tokens_as_first"] = f"{same}/{len(first) * len(runs[mode])}"
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
        del engines
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
    png = path.with_suffix(".png")
    drawn = len(modes) > 1 and plot_speedups([(f"{Path(model).name}, {args.workload} workload", result)], png)
    print(
        f"wrote {path}"
        + (f" and {png}" if drawn else "")
        + f"; tokens/s against {modes[0]}: {result['speedup']}"
    )
    return result
