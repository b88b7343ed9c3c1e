"""`lengths`, the benchmark workload: each row fixes the length of its response (and, with
`task.tool_calls_mean`, where its scripted tool calls fall), so a schedule's speed does not depend on what the
model learns (`laminar.data.lengths`). No held-out split and no warm start: any model runs it."""

from __future__ import annotations

from typing import Any

from laminar.data.lengths import LengthWorkload
from laminar.tasks.task import Row, Task


def rows(cfg: Any) -> list[Row]:
    return LengthWorkload.from_task(cfg).rows(cfg.task.num_prompts)


TASK = Task(
    name="lengths",
    about="the benchmark workload",
    rows=rows,
    reward="laminar.data.lengths:length_reward",
)
