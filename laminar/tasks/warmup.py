"""`laminar warmup [--task NAME] --out DIR`: a built-in task's warm start, a tiny Llama taught the task by a short
supervised run on the demonstrations the task makes (its `WarmStart` in `laminar.tasks`), stopped while it is
still only partly right so that RL has something to improve; the demo starts from `reverse`'s. `--model DIR`
warm-starts a Hugging Face model instead, through its own chat template."""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from laminar.data.codec import TaskCodec, save_model_dir
from laminar.tasks import DEMO, TASKS, WarmStart
from laminar.tasks.task import Example

WARM_STARTS = tuple(name for name, task in TASKS.items() if task.warm_start is not None)
MODEL_LR = 3e-5  # a pretrained model's supervised steps (the tiny model's 3e-3 would wreck it)


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
    tool_share: float = 0.5  # tool_arith: the share of demonstrations that call the calculator
    device: str = "cpu"  # where the supervised steps run ("cuda" for a real model on a GPU machine)

    @classmethod
    def for_task(cls, task: str) -> WarmupConfig:
        """Each task's own warm start: its length of supervised run and batch, stopped while still partly right."""
        start, cfg = warm_start_of(task), cls()
        return replace(cfg, steps=start.steps or cfg.steps, batch_size=start.batch_size or cfg.batch_size)


def warm_start_of(task: str) -> WarmStart:
    start = TASKS[task].warm_start if task in TASKS else None
    if start is None:
        raise ValueError(
            f"warm start for task {task!r}: the built-in tasks with one are {', '.join(WARM_STARTS)}"
        )
    return start


def tiny_warm_start(task: str) -> str:
    """The task whose tiny model a run of `task` without `model.path` starts from: its own, else the demo's."""
    start = TASKS[task].warm_start if task in TASKS else None
    return task if start is not None and start.codec is not None else DEMO


# Bumped when the directory's contents change meaning: 2 = its tokenizer puts BOS before a prompt by itself.
FORMAT = 2


def is_current(path: Path, task: str = DEMO) -> bool:
    """A warm start of `task` built by this version (an older one would read prompts differently)."""
    info = path / "warmup.json"
    if not ((path / "config.json").is_file() and info.is_file()):
        return False
    made = json.loads(info.read_text())
    return made.get("format") == FORMAT and made.get("task", DEMO) == task


def default_warmup_dir(task: str = DEMO) -> Path:
    """Where a task's warm start is kept: `runs/warmup` (the demo's; `runs/warmup-TASK` for another task) in the
    source checkout laminar runs from (found from this file, not the working directory), else the user's cache
    when laminar is installed as a package."""
    warm_start_of(task)
    name = "warmup" if task == DEMO else f"warmup-{task.replace('_', '-')}"
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "laminar").is_dir():
        return root / "runs" / name
    return Path.home() / ".cache" / "laminar" / name


def task_codec(task: str) -> TaskCodec:
    """The tokenizer a task's tiny warm start is built with (and saved beside its weights)."""
    start = warm_start_of(task)
    if start.codec is None:
        raise ValueError(
            f"task {task!r} is warm-started only from a Hugging Face model (its prompts go through a chat "
            "template): give --model DIR"
        )
    return start.codec()


def examples_of(task: str, codec: TaskCodec, cfg: WarmupConfig) -> Callable[[random.Random], Example]:
    """One demonstration a call: the task's prompt and the response the model should learn to write."""
    return warm_start_of(task).examples(codec, cfg)


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


def supervised_batch(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Teacher-forced demonstrations with the loss only where their mask is 1 (what the model writes)."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    for b, (seq, mask) in enumerate(examples):
        row = torch.tensor(seq)
        ids[b, : len(seq)] = row
        attn[b, : len(seq)] = 1
        labels[b, : len(seq)] = torch.where(torch.tensor(mask) == 1, row, -100)
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}


PROGRESS_STEPS, PROGRESS_S = 50, 10.0  # a progress line every this many steps or seconds, whichever is first


def progress_due(step: int, total: int, since_shown_s: float) -> bool:
    """Whether step `step` (1-based) prints a progress line: the first and the last, every `PROGRESS_STEPS`, and
    any once `PROGRESS_S` have passed since the last line (a large model's steps take seconds each)."""
    return step in (1, total) or step % PROGRESS_STEPS == 0 or since_shown_s >= PROGRESS_S


def progress_line(step: int, total: int, loss: float, elapsed_s: float) -> str:
    """`warmup step N/TOTAL loss X, T s, ETA S s`: the time left at the mean step time so far."""
    eta = elapsed_s / step * (total - step)
    return f"warmup step {step}/{total} loss {loss:.3f}, {elapsed_s:.1f} s, ETA {eta:.0f} s"


def warmup(
    out: str | Path,
    cfg: WarmupConfig | None = None,
    task: str = DEMO,
    log: bool = True,
    model_path: str | Path | None = None,
) -> Path:
    """The warm start of `task` in `out`. With `model_path`, a Hugging Face model directory instead of the tiny
    Llama: the demonstrations go through its own tokenizer and chat template (prompt, call, the tool's output as
    its template renders a tool turn, answer), exactly as its rollouts will read and write them."""
    cfg = cfg or WarmupConfig.for_task(task)
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    if model_path is None:
        codec = task_codec(task)
        model = build_demo_model(codec.vocab_size, cfg, codec)
    else:
        from transformers import AutoModelForCausalLM

        from laminar.engine.model_dir import check_model_dir

        warm_start_of(task)
        codec = TaskCodec.from_dir(check_model_dir(model_path))
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).train()
    example = examples_of(task, codec, cfg)
    device = torch.device(cfg.device)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30))
    t0 = t_shown = time.perf_counter()
    for step in range(1, cfg.steps + 1):
        batch = supervised_batch([example(rng) for _ in range(cfg.batch_size)], codec.pad_id)
        loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        now = time.perf_counter()
        if log and progress_due(step, cfg.steps, now - t_shown):
            print(progress_line(step, cfg.steps, loss.item(), now - t0), flush=True)
            t_shown = now

    model.to("cpu")
    if model_path is None:
        out = save_model_dir(model, codec, out)
    else:  # the model's own tokenizer files, chat template included
        out = Path(out)
        model.save_pretrained(out)
        codec.tokenizer.save_pretrained(out)
    n_params = sum(p.numel() for p in model.parameters())
    info = {
        "format": FORMAT,
        "task": task,
        **({"model": str(model_path), "lr": cfg.lr} if model_path is not None else {}),
        "params": n_params,
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "device": cfg.device,
        **{name: getattr(cfg, name) for name in warm_start_of(task).reads},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "warmup.json").write_text(json.dumps(info, indent=2))
    if log:
        print(f"warm start: {n_params} params, {info['seconds']}s -> {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="laminar warmup", description=__doc__)
    ap.add_argument("--task", choices=WARM_STARTS, default=DEMO, help=f"the built-in task (default: {DEMO})")
    ap.add_argument(
        "--out",
        default=None,
        help=f"directory for the HF model (default: {default_warmup_dir()} for {DEMO}, runs/warmup-TASK for "
        "another task: where `laminar train` looks for it)",
    )
    ap.add_argument("--steps", type=int, default=None, help="supervised steps (default: the task's own)")
    ap.add_argument("--seed", type=int, default=WarmupConfig.seed)
    ap.add_argument(
        "--model",
        default=None,
        help="a local Hugging Face model directory to warm-start instead of the tiny Llama (needs --out)",
    )
    ap.add_argument(
        "--lr",
        type=float,
        default=None,
        help=f"learning rate (default: {WarmupConfig.lr}; with --model {MODEL_LR})",
    )
    ap.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help=f"demonstrations a step (default: the task's own, else {WarmupConfig.batch_size})",
    )
    ap.add_argument(
        "--device",
        default=WarmupConfig.device,
        help="where the supervised steps run: cpu (default) or cuda (a GPU machine)",
    )
    args = ap.parse_args(argv)
    if args.device.split(":")[0] not in ("cpu", "cuda"):
        ap.error(f"--device {args.device!r}: give cpu or cuda (cuda:N for one GPU of several)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this machine has no CUDA GPU; give --device cpu")
    if args.steps is not None and args.steps < 1:
        ap.error(f"--steps {args.steps}: a warm start needs at least 1 supervised step")
    if args.model and not args.out:
        ap.error("--model needs --out: the default directories hold the tiny model's warm starts")
    if not args.model and warm_start_of(args.task).codec is None:
        ap.error(
            f"--task {args.task} is warm-started only from a Hugging Face model: give --model DIR and --out"
        )
    cfg = replace(WarmupConfig.for_task(args.task), seed=args.seed, device=args.device)
    if args.batch_size is not None and args.batch_size < 1:
        ap.error(f"--batch-size {args.batch_size}: a step needs at least 1 demonstration")
    if args.steps is not None:
        cfg = replace(cfg, steps=args.steps)
    if args.batch_size is not None:
        cfg = replace(cfg, batch_size=args.batch_size)
    if args.lr is not None or args.model:
        cfg = replace(cfg, lr=args.lr if args.lr is not None else MODEL_LR)
    warmup(args.out or default_warmup_dir(args.task), cfg, args.task, model_path=args.model)
    return 0
