"""Reward functions that fail on purpose, row by row (`row["mode"]`), for the fault tests; importable by the
replicas because Ray puts the driver's working directory (the repository) on their path."""

from __future__ import annotations

from typing import Any

from laminar.rewards.reverse import reverse_reward


def by_mode(response: str, row: dict[str, Any]) -> Any:
    mode = row["mode"]
    if mode == "nan":
        return float("nan")
    if mode == "string":
        return "1.0"
    if mode == "raise":
        raise RuntimeError(f"judge unavailable for row {row['row']}")
    return reverse_reward(response, row)
