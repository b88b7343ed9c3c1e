"""The built-in tasks, by the name `task.name` gives: each is one module of this package that makes a `Task` (its
rows, held-out rows, default reward, optional warm start and checks) and one entry of `TASKS`.

Light to import (`laminar.config` checks names here): a task module imports tokenizers, models and tools only
inside its functions."""

from __future__ import annotations

from laminar.tasks import arith, chain, lengths, reverse, tool_arith
from laminar.tasks.task import Task, WarmStart

TASKS: dict[str, Task] = {
    t.name: t for t in (reverse.TASK, lengths.TASK, arith.TASK, tool_arith.TASK, chain.TASK)
}
DEMO = "reverse"  # the default run's task; its warm start is `runs/warmup`

__all__ = ["DEMO", "TASKS", "Task", "WarmStart", "choices", "task_named"]


def choices() -> str:
    """The valid values of `task.name`, for error messages."""
    return ", ".join(f"{name} ({task.about})" for name, task in TASKS.items()) + " or a .jsonl file"


def task_named(name: str) -> Task:
    """The built-in task `name`; any other name is refused with the valid ones."""
    if name not in TASKS:
        raise ValueError(f"task.name={name!r} is invalid: {choices()}")
    return TASKS[name]
