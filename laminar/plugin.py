"""User code plugs in by dotted path, `package.module:function` (reward functions, buffer samplers, tools)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def load_function(
    path: str, what: str, example: str, error: type[ValueError] = ValueError
) -> Callable[..., Any]:
    """The function `path` names; a bad path raises `error` naming `what`, the path and what would be right."""
    module_name, sep, func_name = path.partition(":")
    if not sep or not module_name or not func_name:
        raise error(f"{what} {path!r}: expected 'module:function', e.g. {example!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise error(f"{what} {path!r}: cannot import module {module_name!r} ({e})") from e
    fn = getattr(module, func_name, None)
    if not callable(fn):
        have = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise error(f"{what} {path!r}: module {module_name!r} has no function {func_name!r} (has {have})")
    return fn
