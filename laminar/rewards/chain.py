"""Reward for the built-in `chain` task: the last `\\boxed{}` holds the final number, read as the math reward
reads a box."""

from __future__ import annotations

from typing import Any

from laminar.rewards.math import last_boxed, score_with


def chain_reward(response: str, row: dict[str, Any]) -> float:
    """1.0 when the last `\\boxed{}` holds the final number, else 0.0."""
    return score_with(response, row, (last_boxed,))
