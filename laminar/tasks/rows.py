"""The run's rows where a built-in task may make them: the data files when the config names some, else the task
`task.name` names (a registry entry, or a .jsonl file). The files' own loading and checks are
`laminar.data.dataset`'s; this is the one place that asks the registry for rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from laminar.data.dataset import load_file, load_rows, normalise_row
from laminar.tasks import TASKS, task_named


def train_rows(cfg: Any) -> list[dict[str, Any]]:
    """`data.train_files` when set, else the rows `task.name` names (a built-in task or a .jsonl file)."""
    d, t = cfg.data, cfg.task
    if d.train_files:
        return load_rows(d.train_files, d.prompt_key, "train")
    if Path(t.name).suffix == ".jsonl":
        return load_file(t.name, d.prompt_key)
    made = task_named(t.name).rows(cfg)
    return [normalise_row(r, i, f"task {t.name}") for i, r in enumerate(made)]


def held_out_rows(cfg: Any) -> list[dict[str, Any]]:
    """The built-in task's held-out split (rows training never draws), or [] when it has none."""
    task = TASKS.get(cfg.task.name)
    if task is None or task.held_out_rows is None:
        return []
    made = task.held_out_rows(cfg)
    return [normalise_row(r, i, f"task {task.name} (held out)") for i, r in enumerate(made)]
