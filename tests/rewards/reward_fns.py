"""Reward functions for the reward tests, module-level so worker processes import them by dotted path."""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

BIGNUM_EXPONENT = 2 * 10**7  # 9 ** this: some 25 s of C on the 2-core test box, the GIL held throughout


def one(response: str, row: dict[str, Any]) -> float:
    return 1.0


def value_of_row(response: str, row: dict[str, Any]) -> Any:
    """Returns whatever the row says, a non-number included."""
    return row["value"]


def raises_key_error(response: str, row: dict[str, Any]) -> float:
    raise KeyError("answer")


def sleeps_on_row_zero(response: str, row: dict[str, Any]) -> float:
    """Row 0 sleeps far past any test's timeout; every other row scores 1.0 at once."""
    if row["row"] == 0:
        time.sleep(60)
    return 1.0


def bignum_on_row_zero(response: str, row: dict[str, Any]) -> float:
    """Row 0 computes a big-integer power: one C call that never releases the GIL; every other row scores 1.0."""
    if row["row"] == 0:
        pow(9, BIGNUM_EXPONENT)
    return 1.0


def dies(response: str, row: dict[str, Any]) -> float:
    """Takes its process down: row "exit" with os._exit, row "segfault" by reading address 0, others score 1.0."""
    if row["row"] == "exit":
        os._exit(3)
    if row["row"] == "segfault":
        ctypes.string_at(0)
    return 1.0


def verl_compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> Any:
    """verl's signature: a dict with a "score" (and another key, as verl's richer scorers return) for gsm8k rows,
    a float for the others."""
    right = solution_str.strip().endswith(str(ground_truth))
    if data_source == "openai/gsm8k":
        return {"score": 1.0 if right else 0.0, "acc": right, "index": (extra_info or {}).get("index")}
    return 1.0 if right else 0.0


def verl_two_params(solution_str: str, ground_truth: str, method: str = "strict") -> float:
    """A subset of verl's keywords, as verl's own gsm8k.compute_score takes."""
    return float(solution_str.strip() == ground_truth)


def verl_kwargs(solution_str: str, **kwargs: Any) -> float:
    """Takes whatever verl passes; scores 1 when every keyword arrived."""
    return float(set(kwargs) == {"data_source", "ground_truth", "extra_info"})
