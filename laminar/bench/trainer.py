"""`laminar bench trainer`: the trainer's step on its own, on a random-initialised model of a named shape and
synthetic GRPO groups of realistic lengths: step time, trained tokens per second, the share of padding, and the
model FLOPs utilisation (6 x parameters x tokens / time / the card's peak). With `--profile`, a table of the
step's operators by device time. Writes `DIR/trainer.json` and `DIR/trainer.md` (and `DIR/profile.txt`).
A benchmark, never a test: nothing here asserts a speed."""

from __future__ import annotations

import argparse
import math
import platform
import random
import time
from pathlib import Path
from typing import Any

import torch

from laminar.data.records import Trajectory
from laminar.engine.random_model import SHAPES, shape_config
from laminar.jsonio import write_json

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense


def synthetic_groups(
    groups: int, group_size: int, prompt: int, response_median: int, response_max: int, vocab: int, seed: int
) -> list[list[Trajectory]]:
    """Groups with lognormal response lengths (p99 about 4x the median, capped), random tokens and rewards."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt_ids = [rng.randrange(vocab) for _ in range(prompt)]
        group = []
        for i in range(group_size):
            n = min(response_max, max(1, round(math.exp(rng.gauss(math.log(response_median), 0.6)))))
            group.append(
                Trajectory(
                    traj_id=f"{g}:{i}",
                    group_id=g,
                    sample_idx=i,
                    prompt_ids=prompt_ids,
                    response_ids=[rng.randrange(vocab) for _ in range(n)],
                    logprobs=[-2.0] * n,
                    version=0,
                    reward=float(rng.random() < 0.5),
                    finish_reason="stop",
                )
            )
        out.append(group)
    return out


def padded_tokens(trainer: Any, trajs: list[Trajectory]) -> tuple[int, int]:
    """(tokens the trainer's forward sees, micro-batches): each micro-batch padded to its longest sequence."""
    lengths = [t.num_tokens for t in trajs]
    cuts = trainer.micro_batches(lengths, list(range(len(trajs))))
    return sum(len(c) * max(lengths[i] for i in c) for c in cuts), len(cuts)


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM

    from laminar.trainer.trainer import Trainer, TrainerConfig

    ap = argparse.ArgumentParser(prog="laminar bench trainer", description=__doc__)
    ap.add_argument("--shape", default="smollm2-135m", choices=sorted(SHAPES))
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=45)
    ap.add_argument("--response-median", type=int, default=80)
    ap.add_argument("--response-max", type=int, default=200)
    ap.add_argument("--micro-batch", type=int, default=64)
    ap.add_argument(
        "--micro-batch-tokens", type=int, default=0, help="> 0: fill micro-batches by padded tokens"
    )
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--profile", action="store_true", help="also profile one step (operators by device time)")
    ap.add_argument("--out", default="results/trainer-bench")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape_config(args.shape), dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    cfg = TrainerConfig(
        lr=1e-6,
        micro_batch_size=args.micro_batch,
        micro_batch_tokens=args.micro_batch_tokens,
        device=args.device,
        threads=8,
    )
    trainer = Trainer(cfg, model=model)
    vocab = model.config.vocab_size
    batches = [
        synthetic_groups(
            args.groups, args.group_size, args.prompt, args.response_median, args.response_max, vocab, seed
        )
        for seed in range(args.steps + 1)
    ]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    trainer.train_step(batches[0])  # warm-up: allocator, kernels
    sync()
    times, tokens, seen, cuts = [], [], [], 0
    for groups in batches[1:]:
        trajs = [t for g in groups for t in g]
        t = time.perf_counter()
        trainer.train_step(groups)
        sync()
        times.append(time.perf_counter() - t)
        tokens.append(sum(x.num_tokens for x in trajs))
        padded, cuts = padded_tokens(trainer, trajs)
        seen.append(padded)
    step_s = sorted(times)[len(times) // 2]
    tok = sum(tokens) / len(tokens)
    peak = peak_tflops(device)
    achieved = 6 * params * tok / step_s / 1e12
    result: dict[str, Any] = {
        "machine": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "command": "laminar bench trainer " + " ".join(argv or []),
        "shape": args.shape,
        "params": params,
        "sequences": args.groups * args.group_size,
        "micro_batch": args.micro_batch,
        "micro_batch_tokens": args.micro_batch_tokens,
        "micro_batches_per_step": cuts,
        "step_s_median": round(step_s, 4),
        "step_s": [round(x, 4) for x in times],
        "tokens_per_step": tok,
        "padding_share": round(1 - sum(tokens) / sum(seen), 3),
        "tokens_per_s": round(tok / step_s, 1),
        "model_tflops": round(achieved, 2),
        "mfu": round(achieved / peak, 4) if peak else None,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            trainer.train_step(batches[-1])
            sync()
        key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        (out / "profile.txt").write_text(prof.key_averages().table(sort_by=key, row_limit=35))
    write_json(out / "trainer.json", result)
    lines = [f"| {k} | {v} |" for k, v in result.items() if k != "step_s"]
    (out / "trainer.md").write_text("| field | value |\n|---|---|\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
