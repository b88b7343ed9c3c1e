"""Rule-based reward for the built-in reverse task: exact match, with partial credit so GRPO sees a gradient."""

from __future__ import annotations

from typing import Any


def reverse_reward(response: str, row: dict[str, Any]) -> float:
    """1.0 for an exact answer; otherwise 0.5 x the fraction of answer positions right (extra tokens count
    against it), so a model that gets most digits right is told it is closer."""
    want, got = row["answer"].split(), response.split()
    if got == want:
        return 1.0
    hits = sum(a == b for a, b in zip(want, got))
    return 0.5 * hits / max(len(want), len(got), 1)
