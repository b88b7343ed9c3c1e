"""Dataset rows: loaded from JSONL or made by a task, checked once so a bad row fails early and by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REQUIRED_FIELDS: dict[str, type] = {"prompt": str}


class DatasetError(ValueError):
    """A dataset row is malformed; the message names the row and the field."""


def validate_row(
    row: Any, i: int, required: dict[str, type] | None = None, source: str = "dataset"
) -> dict[str, Any]:
    required = REQUIRED_FIELDS if required is None else required
    if not isinstance(row, dict):
        raise DatasetError(
            f"{source} row {i}: expected an object with fields {sorted(required)}, got {type(row).__name__}"
        )
    for name, kind in required.items():
        if name not in row:
            raise DatasetError(f"{source} row {i}: missing field {name!r} (has {sorted(row)})")
        if not isinstance(row[name], kind):
            raise DatasetError(
                f"{source} row {i}: field {name!r} must be {kind.__name__}, got {type(row[name]).__name__} "
                f"({row[name]!r:.60})"
            )
    if isinstance(row.get("prompt"), str) and not row["prompt"].strip():
        raise DatasetError(f"{source} row {i}: field 'prompt' is empty")
    return row


def validate_rows(
    rows: list[dict[str, Any]], required: dict[str, type] | None = None, source: str = "dataset"
) -> list[dict[str, Any]]:
    return [validate_row(row, i, required, source) for i, row in enumerate(rows)]


def load_jsonl(path: str | Path, required: dict[str, type] | None = None) -> list[dict[str, Any]]:
    """One JSON object per line; blank lines skipped; row numbers in errors are 0-based line indices."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset {path} does not exist (expected a JSONL file, one object per line)")
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path} row {i}: not valid JSON ({e.msg} at column {e.colno})") from e
        rows.append(validate_row(row, i, required, source=str(path)))
    if not rows:
        raise DatasetError(
            f"dataset {path} has no rows (the file is empty or blank); expected one JSON object per line, "
            f"each with the fields {sorted(REQUIRED_FIELDS if required is None else required)}"
        )
    return rows
