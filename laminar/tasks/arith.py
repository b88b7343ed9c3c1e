"""`arith`: arithmetic word problems at graded difficulty (`task.arith_levels`, `laminar.data.arith`), as chat
messages, scored by the math reward on the boxed answer (`laminar.rewards.math`). The held-out split holds the
problems whose expressions training never draws, at the same levels."""

from __future__ import annotations

from typing import Any

from laminar.data.arith import ArithTask, parse_levels
from laminar.tasks.task import Row, Task


def _problems(cfg: Any) -> ArithTask:
    return ArithTask(parse_levels(cfg.task.arith_levels), seed=cfg.task.seed)


def rows(cfg: Any) -> list[Row]:
    return _problems(cfg).rows(cfg.task.num_prompts)


def held_out_rows(cfg: Any) -> list[Row]:
    return _problems(cfg).held_out_rows(cfg.eval.num_prompts)


def check(cfg: Any) -> None:
    parse_levels(cfg.task.arith_levels)  # its error names task.arith_levels and every level


TASK = Task(
    name="arith",
    about="math word problems",
    rows=rows,
    held_out_rows=held_out_rows,
    reward="laminar.rewards.math:default_score",
    check=check,
)
