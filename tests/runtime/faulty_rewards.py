"""Reward functions that fail on purpose, row by row (`row["mode"]`), for the fault tests; importable by the
replicas because Ray puts the driver's working directory (the repository) on their path."""

from __future__ import annotations

import threading
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


def needs_a_missing_module(response: str, row: dict[str, Any]) -> float:
    """The import the environment lacks, inside the function: fails on every call."""
    import laminar_no_such_module  # noqa: F401

    return 1.0


def nan_always(response: str, row: dict[str, Any]) -> float:
    return float("nan")


def zero_always(response: str, row: dict[str, Any]) -> float:
    """A reward that scores everything 0: a score, never a failure."""
    return 0.0


def never_returns(response: str, row: dict[str, Any]) -> float:
    threading.Event().wait()
    return 0.0


def right_or_fails(response: str, row: dict[str, Any]) -> float:
    """1 for the right answer; any other answer fails, the row's way (`mode`: raise or nan). A reward whose
    wrong-answer branch is broken: called with the ground truth, as the dry run calls it, it works."""
    if response == row["ground_truth"]:
        return 1.0
    if row["mode"] == "nan":
        return float("nan")
    raise RuntimeError(f"cannot parse the answer {response!r}")
