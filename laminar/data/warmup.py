"""`laminar warmup --out DIR`: the demo's warm start, a tiny Llama taught the reverse task by a short
supervised run, stopped while it is still only partly right so that RL has something to improve."""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from laminar.data.tasks import ReverseTask, TaskCodec, save_model_dir


@dataclass
class WarmupConfig:
    hidden_size: int = 128
    layers: int = 4
    heads: int = 4
    intermediate_size: int = 256
    steps: int = 200
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 1234  # the RL dataset uses other seeds, so warm-up rows are not the RL rows
    threads: int = 2


# Bumped when the directory's contents change meaning: 2 = its tokenizer puts BOS before a prompt by itself.
FORMAT = 2


def is_current(path: Path) -> bool:
    """A warm start built by this version (an older one would read prompts differently)."""
    info = path / "warmup.json"
    return (
        (path / "config.json").is_file()
        and info.is_file()
        and json.loads(info.read_text()).get("format") == FORMAT
    )


def default_warmup_dir() -> Path:
    """Where the demo's warm start is kept: `runs/warmup` in the source checkout laminar runs from (found from
    this file, not the working directory), else the user's cache when laminar is installed as a package."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "laminar").is_dir():
        return root / "runs" / "warmup"
    return Path.home() / ".cache" / "laminar" / "warmup"


def build_demo_model(
    vocab_size: int, cfg: WarmupConfig, codec: TaskCodec, max_positions: int = 128
) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=codec.bos_id,
        eos_token_id=codec.eos_id,
        pad_token_id=codec.pad_id,
    )
    return LlamaForCausalLM(config)


def supervised_batch(
    task: ReverseTask, codec: TaskCodec, rng: random.Random, size: int
) -> dict[str, torch.Tensor]:
    """Teacher-forced (prompt, answer) pairs with the loss on answer tokens only."""
    seqs, starts = [], []
    for _ in range(size):
        row = task.make_row(rng)
        p = codec.encode_prompt(row["prompt"])
        seqs.append(p + codec.encode_answer(row["answer"]))
        starts.append(len(p))
    width = max(len(s) for s in seqs)
    ids = torch.full((size, width), codec.pad_id, dtype=torch.long)
    labels = torch.full((size, width), -100, dtype=torch.long)
    attn = torch.zeros((size, width), dtype=torch.long)
    for b, (s, st) in enumerate(zip(seqs, starts)):
        ids[b, : len(s)] = torch.tensor(s)
        attn[b, : len(s)] = 1
        labels[b, st : len(s)] = torch.tensor(s[st:])
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}


def warmup(
    out: str | Path, cfg: WarmupConfig | None = None, task: ReverseTask | None = None, log: bool = True
) -> Path:
    cfg, task = cfg or WarmupConfig(), task or ReverseTask()
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    codec = TaskCodec()
    model = build_demo_model(codec.vocab_size, cfg, codec)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30))
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        loss = model(**supervised_batch(task, codec, rng, cfg.batch_size)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log and (step % 50 == 0 or step == cfg.steps - 1):
            print(
                f"warmup step {step:4d}  loss {loss.item():.3f}  {time.perf_counter() - t0:5.1f}s", flush=True
            )

    out = save_model_dir(model, codec, out)
    n_params = sum(p.numel() for p in model.parameters())
    info = {
        "format": FORMAT,
        "task": "reverse",
        "params": n_params,
        "steps": cfg.steps,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "warmup.json").write_text(json.dumps(info, indent=2))
    if log:
        print(f"warm start: {n_params} params, {info['seconds']}s -> {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="laminar warmup", description=__doc__)
    ap.add_argument(
        "--out",
        default=str(default_warmup_dir()),
        help=f"directory for the HF model (default: {default_warmup_dir()}, where `laminar train` looks for it)",
    )
    ap.add_argument("--steps", type=int, default=WarmupConfig.steps)
    ap.add_argument("--seed", type=int, default=WarmupConfig.seed)
    args = ap.parse_args(argv)
    warmup(args.out, WarmupConfig(steps=args.steps, seed=args.seed))
    return 0
