"""`laminar bench trainer`: the trainer's step on its own, on a random-initialised model of a named shape and
synthetic GRPO groups of realistic lengths, on one rank or an FSDP2 group of `--ranks` (one process per GPU,
spawned here; NCCL on GPU, gloo on CPU). Reports the step time, trained tokens per second, the share of
padding, the model FLOPs utilisation (the products the step runs, `step_flops`, over the time and the cards'
peak; `mfu_6nd` beside it, from 6 x parameters x tokens), the peak memory per GPU, and the actor's stall per
publish: every rank writing its own rows into one shared-memory slot (as the runtime does), beside the time to
copy one rank's shard into pinned host memory (the floor of that stall). With `--lora-rank`, the trainer trains
LoRA adapters and publishes them merged or alone (`--lora-publish`, as `trainer.lora_publish`); every run then
also times what a replica does with a version, `Engine.load_weights` from page-locked host memory on the same
device (a copy of the whole model, or the base plus B A for the adapted weights): with the publish stall and the
published bytes, the three costs of the two LoRA publishes.
With `--profile`, a table of rank 0's operators by device time. Writes `DIR/trainer.json` and `DIR/trainer.md`
(and `DIR/profile.txt`). A benchmark, never a test: nothing here asserts a speed."""

from __future__ import annotations

import argparse
import os
import platform
import socket
import time
from pathlib import Path
from typing import Any

import torch

from laminar.bench.trainer_workload import padded_tokens, peak_tflops, step_batches, step_flops
from laminar.config.trainer import ADVANTAGES
from laminar.engine.random_model import SHAPES, shape_config
from laminar.jsonio import write_json
from laminar.telemetry.provenance import code_digest


def measure(rank: int, world: int, port: int, args: argparse.Namespace) -> dict[str, Any] | None:
    """One rank's part; rank 0 returns the result (and writes it when run as a spawned rank)."""
    from transformers import AutoModelForCausalLM

    from laminar.config import TrainerConfig
    from laminar.engine.layout import WeightLayout
    from laminar.relay.publisher import ShardWriter
    from laminar.relay.slots import ShmBuffer, new_buffer_path
    from laminar.trainer.trainer import Trainer

    cuda = args.device.startswith("cuda")
    if world > 1:
        import torch.distributed as dist

        if cuda:
            torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape_config(args.shape), dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    cfg = TrainerConfig(
        lr=1e-6,
        micro_batch=args.micro_batch,
        micro_batch_tokens=args.micro_batch_tokens,
        num_cpus=8,
        activation_checkpointing=args.activation_checkpointing,
        cpu_offload=args.cpu_offload,
        packing=args.packing,
        compile=args.compile,
        reshard_after_forward=not args.no_reshard,
        advantage=args.advantage,
        lora_rank=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_target_modules=args.lora_targets.split(","),
        lora_publish=args.lora_publish,
    )
    trainer = Trainer(
        cfg,
        device="cuda" if cuda else "cpu",
        compute_dtype=args.compute_dtype,
        publish_dtype="bfloat16" if cuda else "",
        model=model,
        rank=rank,
        world=world,
    )
    del model
    model_config = trainer.model.config
    batches = step_batches(args, model_config.vocab_size)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    barrier = (lambda: __import__("torch.distributed").distributed.barrier()) if world > 1 else (lambda: None)
    trainer.train_step(batches[0])  # warm-up: allocator, kernels
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, tokens, seen, work, cuts = [], [], [], [], 0
    for groups in batches[1:]:
        trajs = [t for g in groups for t in g]
        barrier()
        t = time.perf_counter()
        trainer.train_step(groups)
        sync()
        times.append(time.perf_counter() - t)
        tokens.append(sum(x.num_tokens for x in trajs))
        work.append(step_flops(model_config, [(len(x.prompt_ids), len(x.response_ids)) for x in trajs]))
        padded, cuts = padded_tokens(trainer, trajs)
        seen.append(padded)
    peak_mem = torch.cuda.max_memory_allocated() / 2**30 if cuda else None

    # the publish: each rank its rows into one slot, as TrainerActor does; and the floor, a pinned-host copy
    shards = trainer.weight_shards() if world > 1 else None
    layout = (
        WeightLayout.of_specs([(s.name, s.shape, s.dtype) for s in shards])
        if shards
        else WeightLayout.of(trainer.named_weights())
    )
    slot_path = [new_buffer_path("bench", 0)] if rank == 0 else [None]
    if world > 1:
        import torch.distributed as dist

        dist.broadcast_object_list(slot_path, src=0)
    slot = ShmBuffer(slot_path[0], layout.total_bytes) if rank == 0 else None
    barrier()
    writer = ShardWriter()
    stalls, floors = [], []
    phases: dict[str, list[float]] = {"cast": [], "write": [], "agree": []}
    for _ in range(args.publishes):  # TrainerActor._publish's steps, each timed
        barrier()
        t = time.perf_counter()
        parts, flag = trainer.publish_parts()
        t_cast = time.perf_counter()
        if world > 1:
            import torch.distributed as dist

            where = [slot_path[0]]
            dist.broadcast_object_list(where, src=0)
            writer.write(where[0], layout, parts)
        else:
            from laminar.engine.weights import flatten_into

            flatten_into(parts, layout, writer._map(slot_path[0], layout.total_bytes).array)
        t_write = time.perf_counter()
        trainer.raise_nonfinite(flag, summary=True)  # sharded: the all-reduce every rank waits for
        end = time.perf_counter()
        stalls.append(end - t)
        for key, a, b in (("cast", t, t_cast), ("write", t_cast, t_write), ("agree", t_write, end)):
            phases[key].append(b - a)
    local = [s.local for s in (shards or [])] or list(trainer.named_weights().values())
    nbytes = sum(x.numel() * x.element_size() for x in local)
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    for _ in range(args.publishes):
        sync()
        t = time.perf_counter()
        off = 0
        for x in local:
            n = x.numel() * x.element_size()
            pinned[off : off + n].view(x.dtype).view(x.shape).copy_(x, non_blocking=True)
            off += n
        sync()
        floors.append(time.perf_counter() - t)
    writer.close()
    applies = replica_applies(trainer, layout, args, device) if world == 1 else []

    mems = [peak_mem]
    if world > 1:
        import torch.distributed as dist

        mems = [None] * world
        dist.all_gather_object(mems, peak_mem)
    if rank == 0 and args.profile:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            trainer.train_step(batches[-1])
            sync()
        key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        (Path(args.out) / "profile.txt").write_text(prof.key_averages().table(sort_by=key, row_limit=35))
    elif args.profile and world > 1:
        trainer.train_step(batches[-1])
    if slot is not None:
        slot.close(unlink=True)
    if world > 1:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
    if rank != 0:
        return None
    step_s = sorted(times)[len(times) // 2]
    tok = sum(tokens) / len(tokens)
    peak = peak_tflops(device)
    flops = sum(w.total for w in work) / len(work)
    achieved = flops / step_s / 1e12
    achieved_6nd = 6 * params * tok / step_s / 1e12
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {
        "machine": torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "code": code_digest(),
        "command": "laminar bench trainer " + " ".join(args.argv),
        "shape": args.shape,
        "params": params,
        "ranks": world,
        "sequences": args.groups * args.group_size,
        "response_median": args.response_median,
        "response_p99_ratio": args.response_p99_ratio,
        "response_max": args.response_max,
        "micro_batch": args.micro_batch,
        "micro_batch_tokens": args.micro_batch_tokens,
        "packed": trainer.packed,
        "activation_checkpointing": args.activation_checkpointing,
        "cpu_offload": args.cpu_offload,
        "compile": args.compile,
        "reshard_after_forward": not args.no_reshard,
        "advantage": args.advantage,  # gae: PPO's critic beside the policy, sharded as it is
        "compute_dtype": args.compute_dtype
        or (
            ""
            if args.device != "cuda"
            else "bfloat16"
            if args.ranks == 1
            else "bfloat16 (FSDP mixed precision)"
        ),
        "micro_batches_per_step_rank0": cuts,
        "step_s_median": round(step_s, 4),
        "step_s": [round(x, 4) for x in times],
        "tokens_per_step": tok,
        "padding_share": round(1 - sum(tokens) / max(sum(seen), 1), 3) if world == 1 else None,
        "tokens_per_s": round(tok / step_s, 1),
        # a measured step's model FLOPs on average (`step_flops`), by part
        "model_flops_per_step": {
            part: round(sum(getattr(w, part) for w in work) / len(work))
            for part in ("layers", "attention", "output_layer")
        },
        "model_tflops": round(achieved, 2),
        "mfu": round(achieved / (peak * world), 4) if peak else None,
        # the same over all the measured steps' FLOPs and time (the median step above is the headline; a
        # batch of outlying steps moves this one)
        "mfu_total_time": round(sum(w.total for w in work) / sum(times) / 1e12 / (peak * world), 4)
        if peak
        else None,
        # the figure these rows gave before: 6 x parameters x tokens, which charges the embedding lookup as a
        # product and the output layer at prompt positions, and leaves attention out
        "mfu_6nd": round(achieved_6nd / (peak * world), 4) if peak else None,
        "peak_memory_gib_per_rank": [round(m, 2) if m is not None else None for m in mems],
        "published_mib": round(layout.total_bytes / 2**20, 1),
        "publish_stall_s_median": round(med(stalls), 4),
        "pinned_copy_of_one_shard_s_median": round(med(floors), 4),
        "stall_over_pinned_copy": round(med(stalls) / max(med(floors), 1e-9), 2),
        # rank 0's stall in parts: the weights cast to the publish dtype and the finite flags launched; the
        # slot's path from rank 0 and this rank's rows written; the ranks' agreement that all are finite
        "publish_phases_ms_median": {k: round(1e3 * med(v), 2) for k, v in phases.items()},
        # every publish, in the same parts (the median above takes each part's median on its own)
        "publish_phases_ms": [{k: round(1e3 * phases[k][i], 2) for k in phases} for i in range(len(stalls))],
        "published_tensors": len(layout.entries),
        "published_bytes": layout.total_bytes,
        "lora": {
            "rank": args.lora_rank,
            "alpha": args.lora_alpha,
            "targets": args.lora_targets,
            "publish": args.lora_publish,
        }
        if args.lora_rank
        else None,
        # one rank: a replica's engine on this device loading the published version (Engine.load_weights)
        "replica_apply_s_median": round(med(applies), 4) if applies else None,
        "replica_apply_s": [round(x, 4) for x in applies],
    }


def replica_applies(trainer: Any, layout: Any, args: argparse.Namespace, device: torch.device) -> list[float]:
    """Seconds for a replica's engine (the shape's, random weights, on `device`) to load each of
    `args.publishes` published versions from page-locked host memory, as a replica reads a registered relay
    slot. The first load is not counted: with adapters it copies the base of the adapted weights once."""
    from laminar.engine import Engine
    from laminar.engine.random_model import model_config
    from laminar.engine.weights import flatten_into

    cuda = device.type == "cuda"
    engine = Engine(
        model_config(args.shape),
        device=device,
        dtype=torch.bfloat16 if cuda else torch.float32,
        max_num_seqs=8,
        num_kv_blocks=16,
        use_cuda_graphs=False,
    )
    flat = torch.empty(layout.total_bytes, dtype=torch.uint8, pin_memory=cuda)
    flatten_into(trainer.named_weights(), layout, flat.numpy())
    times = []
    for version in range(args.publishes + 1):
        t = time.perf_counter()
        engine.load_weights(flat, layout, version + 1)
        times.append(time.perf_counter() - t)
    return times[1:]


def _spawned(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    result = measure(rank, world, port, args)
    if result is not None:
        _write(result, args)


def _write(result: dict[str, Any], args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "trainer.json", result)
    lines = [f"| {k} | {v} |" for k, v in result.items() if k != "step_s"]
    (out / "trainer.md").write_text("| field | value |\n|---|---|\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


def parser() -> argparse.ArgumentParser:
    """The command's arguments (also what reads a row's recorded `command` back)."""
    ap = argparse.ArgumentParser(prog="laminar bench trainer", description=__doc__)
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--ranks", type=int, default=1, help="trainer ranks (FSDP2 when > 1), one GPU each")
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=45)
    ap.add_argument("--response-median", type=int, default=80)
    ap.add_argument("--response-p99-ratio", type=float, default=4.0)
    ap.add_argument("--response-max", type=int, default=200)
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument(
        "--micro-batch-tokens", type=int, default=0, help="> 0: fill micro-batches by padded tokens"
    )
    ap.add_argument("--packing", default="auto", choices=["auto", "on", "off"])
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--cpu-offload", action="store_true")
    ap.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (CUDA)")
    ap.add_argument(
        "--no-reshard",
        action="store_true",
        help="ranks > 1: keep each layer's gathered weights from its forward to its backward",
    )
    ap.add_argument(
        "--advantage",
        default="grpo",
        choices=ADVANTAGES,
        help="the trainer's advantage (gae: PPO with its learned critic, a second model trained in the step)",
    )
    ap.add_argument(
        "--compute-dtype",
        default="",
        choices=["", "float32", "bfloat16"],
        help="one rank: the compute copy's dtype ('' = bfloat16 on CUDA; float32 = fp32 weights under bf16 autocast)",
    )
    ap.add_argument("--lora-rank", type=int, default=0, help="> 0: train LoRA adapters of this rank")
    ap.add_argument("--lora-alpha", type=float, default=16.0)
    ap.add_argument(
        "--lora-targets", default="all-linear", help="comma-separated module names, or all-linear"
    )
    ap.add_argument(
        "--lora-publish",
        default="merged",
        choices=["merged", "adapters"],
        help="what a LoRA publish sends: the merged model, or the adapters alone (trainer.lora_publish)",
    )
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--publishes", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--profile", action="store_true", help="also profile one step (operators by device time)")
    ap.add_argument("--out", default="runs/trainer-bench")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    args.argv = list(argv or [])
    if args.ranks < 1:
        ap.error("--ranks must be at least 1")
    if args.lora_rank and args.ranks > 1:
        ap.error("--lora-rank needs --ranks 1 (LoRA runs on one trainer rank)")
    if args.device.startswith("cuda") and args.ranks > torch.cuda.device_count():
        ap.error(
            f"--ranks {args.ranks} needs {args.ranks} GPUs; this machine has {torch.cuda.device_count()}"
        )
    if args.ranks == 1:
        _write(measure(0, 1, 0, args), args)
        return 0
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "4")
    mp.spawn(_spawned, args=(args.ranks, port, args), nprocs=args.ranks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
