"""The one way Laminar writes JSON: strict (a NaN or inf is written as null, and the encoder refuses anything
else non-standard), so a reader in any language parses every file of a run; whole files are written beside
their name and renamed, so a crash never leaves half of one."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def finite_or_null(value: Any) -> Any:
    """`value` with every non-finite float replaced by None, through dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON text: non-finite floats become null; anything else non-standard raises."""
    return json.dumps(finite_or_null(value), allow_nan=False, **kwargs)


def write_json(path: str | Path, value: Any, indent: int | None = 2) -> Path:
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(dumps(value, indent=indent) + "\n")
    tmp.replace(path)
    return path
