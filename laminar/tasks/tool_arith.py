"""`tool_arith`: add or multiply numbers too large to do in one's head, with the calculator tool
(`laminar.data.tool_arith`); the reward reads the answer written after the last tool output
(`laminar.rewards.tool_arith`). Its warm start is a tiny Llama over the task's own character tokenizer that
answers some problems with a calculator call and guesses the rest (`WarmupConfig.tool_share` of its
demonstrations call the tool), so RL has to find that the tool pays."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from laminar.tasks.task import HELD_OUT_SEED, Example, Row, Task, WarmStart

# the warm start's run: long enough that the model writes calls and often copies the tool's output right, short
# enough that it still guesses most answers without the tool (about 1 in 3 of its samples call it)
WARM_START_STEPS = 1200


def rows(cfg: Any) -> list[Row]:
    from laminar.data.tool_arith import ToolArithTask

    return ToolArithTask(seed=cfg.task.seed).rows(cfg.task.num_prompts)


def held_out_rows(cfg: Any) -> list[Row]:
    from laminar.data.tool_arith import ToolArithTask

    return ToolArithTask(seed=cfg.task.seed + HELD_OUT_SEED).rows(cfg.eval.num_prompts)


def check(cfg: Any) -> None:
    tools = cfg.task.tools
    if "calculator" not in tools:
        raise ValueError(
            f"task.tools={tools!r} is invalid: a list that holds calculator when task.name=tool_arith (its model "
            "calls the calculator tool), e.g. task.tools=[calculator]"
        )


def check_codec(codec: Any) -> None:
    from laminar.data.tool_arith import check_tokenizer

    check_tokenizer(codec)


def examples(codec: Any, cfg: Any) -> Callable[[random.Random], Example]:
    """The prompt, then (`cfg.tool_share` of the time) the call and the calculator's output as the replica
    renders it, then the answer."""
    from laminar.data.tool_arith import ToolArithTask, demonstration
    from laminar.tools.builtin import calculator

    arith = ToolArithTask()

    def example(rng: random.Random) -> Example:
        row = arith.make_row(rng)
        use_tool = rng.random() < cfg.tool_share
        output = calculator(row["extra_info"]["expression"]).text if use_tool else ""
        return demonstration(codec, row, use_tool, output)

    return example


def tiny_codec() -> Any:
    from laminar.data.codec import TaskCodec
    from laminar.data.tool_arith import tool_tokenizer

    return TaskCodec(tool_tokenizer(), source="the tool_arith tokenizer")


TASK = Task(
    name="tool_arith",
    about="arithmetic with a calculator tool",
    rows=rows,
    held_out_rows=held_out_rows,
    reward="laminar.rewards.tool_arith:tool_arith_reward",
    warm_start=WarmStart(examples, codec=tiny_codec, steps=WARM_START_STEPS, reads=("tool_share",)),
    check=check,
    check_codec=check_codec,
)
