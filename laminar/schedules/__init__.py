"""One module per schedule; each exposes `dispatch(cfg)` (when replicas get work) and `run(rt, steps, on_step)`."""

import importlib
from types import ModuleType


def get(name: str) -> ModuleType:
    return importlib.import_module(f"laminar.schedules.{name}")
