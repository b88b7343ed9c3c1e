"""Which code produced a result: a digest of the package's source. Results say the code they ran even where no
git checkout travels with them (a GPU machine gets a copy of the working tree, uncommitted edits included)."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path


@cache
def code_digest(root: Path | None = None) -> str:
    """12 hex digits of a SHA-256 over every `.py` file under `root` (the `laminar` package), paths and
    contents."""
    root = root or Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]
