"""Reward functions plug in by dotted path (`module:function`) and never lose a trajectory when they fail."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from laminar.data.records import Trajectory
from laminar.plugin import load_function

RewardFn = Callable[[str, dict[str, Any]], float]
DEFAULT_REWARD = "laminar.rewards.reverse:reverse_reward"


class RewardLoadError(ValueError):
    """The dotted path does not name a callable."""


def load_reward(path: str) -> RewardFn:
    """`package.module:function`; the function takes (response_text, row) and returns a float."""
    return load_function(path, "reward", DEFAULT_REWARD, RewardLoadError)


class RewardScorer:
    """Scores trajectories; a reward function that raises gives 0.0, records why on the trajectory and counts it,
    so one bad row never kills a rollout or drops a group."""

    def __init__(self, fn: RewardFn | str, decode: Callable[[list[int]], str]) -> None:
        self.fn = load_reward(fn) if isinstance(fn, str) else fn
        self.name = fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__qualname__}"
        self.decode = decode
        self.errors = 0
        self.scored = 0

    def score(self, traj: Trajectory, row: dict[str, Any]) -> float:
        self.scored += 1
        try:
            reward = float(self.fn(self.decode(traj.response_ids), row))
        except Exception as e:  # noqa: BLE001 - any failure in user code is recorded, not raised
            self.errors += 1
            where = row.get("row", traj.group_id)
            traj.meta["reward_error"] = (
                f"reward function {self.name} failed on row {where} (trajectory {traj.traj_id}): "
                f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
            )
            reward = 0.0
        traj.reward = reward
        return reward

    def stats(self) -> dict[str, int]:
        return {"scored": self.scored, "reward_errors": self.errors}
