"""`reverse`, the demo: reverse a digit sequence whose length is long-tailed (`laminar.data.tasks.ReverseTask`),
scored by exact match with partial credit (`laminar.rewards.reverse`). Its warm start is the demo's tiny Llama
over the digits tokenizer, and the starting model of every run of a task without a tiny warm start of its own."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from laminar.tasks.task import HELD_OUT_SEED, Example, Row, Task, WarmStart


def rows(cfg: Any) -> list[Row]:
    from laminar.data.tasks import ReverseTask

    return ReverseTask(seed=cfg.task.seed).rows(cfg.task.num_prompts)


def held_out_rows(cfg: Any) -> list[Row]:
    from laminar.data.tasks import ReverseTask

    return ReverseTask(seed=cfg.task.seed + HELD_OUT_SEED).rows(cfg.eval.num_prompts)


def examples(codec: Any, cfg: Any) -> Callable[[random.Random], Example]:
    """The prompt, then the reversed digits and the end token."""
    from laminar.data.tasks import ReverseTask

    reverse = ReverseTask()

    def example(rng: random.Random) -> Example:
        row = reverse.make_row(rng)
        prompt, answer = codec.encode_prompt(row["prompt"]), codec.encode_answer(row["answer"])
        return prompt + answer, [0] * len(prompt) + [1] * len(answer)

    return example


def tiny_codec() -> Any:
    from laminar.data.codec import TaskCodec

    return TaskCodec()  # the demo's digits tokenizer


TASK = Task(
    name="reverse",
    about="the demo",
    rows=rows,
    held_out_rows=held_out_rows,
    reward="laminar.rewards.reverse:reverse_reward",
    warm_start=WarmStart(examples, codec=tiny_codec),
)
