"""Reward for the built-in `tool_arith` task: the answer the model wrote after the last tool output, exact."""

from __future__ import annotations

from typing import Any

from laminar.tasks.tool_arith import OUTPUT_CLOSE


def final_answer(response: str) -> str:
    """What the model wrote after the last tool output (the whole response when it called no tool). The tool's
    output itself is context, so it never counts as the answer."""
    return response.rpartition(OUTPUT_CLOSE)[2].strip()


def tool_arith_reward(response: str, row: dict[str, Any]) -> float:
    """1.0 when the final answer is the row's `answer` digit for digit, else 0.0."""
    if "answer" not in row:
        raise KeyError(
            f"tool_arith_reward needs the row's 'answer' (the value as digits); the row has {sorted(row)}"
        )
    return 1.0 if final_answer(response) == str(row["answer"]) else 0.0
