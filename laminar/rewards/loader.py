"""Reward functions plug in by dotted path (`module:function`) and never lose a trajectory when they fail.

Only a finite number reaches the trainer: a reward function that raises, runs past its timeout or returns
anything but a finite real number (a string, None, NaN, inf) scores 0.0, and the failure is kept as a small
record (trajectory, row, kind, message) that the replica reports and the run logs and counts."""

from __future__ import annotations

import concurrent.futures as cf
import math
import numbers
import threading
import traceback
from collections.abc import Callable
from typing import Any

from laminar.data.records import Trajectory
from laminar.plugin import load_function

RewardFn = Callable[[str, dict[str, Any]], float]
DEFAULT_REWARD = "laminar.rewards.reverse:reverse_reward"
# why a reward became 0.0: the function raised, ran too long, returned a non-number, returned NaN or inf
ERROR_KINDS = ("raised", "timeout", "not_a_number", "not_finite")


class RewardLoadError(ValueError):
    """The dotted path does not name a callable."""


def load_reward(path: str) -> RewardFn:
    """`package.module:function`; the function takes (response_text, row) and returns a float."""
    return load_function(path, "reward", DEFAULT_REWARD, RewardLoadError)


def check_reward(value: Any) -> tuple[float, str | None, str]:
    """(reward, error kind or None, message): a finite real number passes as a float, anything else is 0.0."""
    if isinstance(value, numbers.Real):  # int, float, bool, numpy scalars; not str, None or a tensor
        reward = float(value)
        if math.isfinite(reward):
            return reward, None, ""
        return 0.0, "not_finite", f"returned {reward!r}; a reward must be a finite number"
    return (
        0.0,
        "not_a_number",
        f"returned {type(value).__name__} {value!r:.80}; a reward must be a finite number",
    )


class RewardScorer:
    """Scores trajectories. A failure gives 0.0, is noted on the trajectory (`meta["reward_error"]`) and queued
    for the replica's next report (`drain_errors`), so one bad row never kills a rollout or drops a group.

    With `timeout_s`, each call runs on its own daemon thread; a call that runs past it is abandoned (Python
    cannot stop a thread; a daemon one at least never holds up the process's exit). Safe to call from several
    threads at once (`ScoringPool`)."""

    def __init__(
        self,
        fn: RewardFn | str,
        decode: Callable[[list[int]], str],
        timeout_s: float | None = None,
        decode_turns: Callable[[list[int], list[int]], str] | None = None,
    ) -> None:
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"reward timeout_s={timeout_s}: must be > 0 (or None for no limit)")
        self.fn = load_reward(fn) if isinstance(fn, str) else fn
        self.name = fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__qualname__}"
        self.decode = decode
        # a response with tool outputs (a loss mask) as one text, its turns and outputs in order
        # (`TaskCodec.response_text`); without it such a response is read by `decode` alone
        self.decode_turns = decode_turns
        self.timeout_s = timeout_s
        self.errors = 0
        self.scored = 0
        self.pending: list[dict[str, Any]] = []  # failures not yet reported
        self._lock = threading.Lock()  # scoring (several threads) and reporting run on different threads

    def score(self, traj: Trajectory, row: dict[str, Any]) -> float:
        if traj.loss_mask and self.decode_turns is not None:
            text = self.decode_turns(traj.response_ids, traj.loss_mask)
        else:
            text = self.decode(traj.response_ids)
        reward, kind, message = self._call(text, row)
        with self._lock:
            self.scored += 1
            self.errors += kind is not None
        if kind is not None:
            where = row.get("row", traj.group_id)
            traj.meta["reward_error"] = (
                f"reward function {self.name} on row {where} (trajectory {traj.traj_id}): {message}"
            )
            error = {
                "traj_id": traj.traj_id,
                "row": where,
                "error_kind": kind,
                "error": message.splitlines()[0],
            }
            with self._lock:
                self.pending.append(error)
        traj.reward = reward
        return reward

    def _call(self, text: str, row: dict[str, Any]) -> tuple[float, str | None, str]:
        if self.timeout_s is None:
            return self._run(text, row)
        result: list[tuple[float, str | None, str]] = []
        worker = threading.Thread(
            target=lambda: result.append(self._run(text, row)), name="reward", daemon=True
        )
        worker.start()
        worker.join(self.timeout_s)
        if not result:
            return 0.0, "timeout", f"did not return within {self.timeout_s:g}s (task.reward_timeout_s)"
        return result[0]

    def _run(self, text: str, row: dict[str, Any]) -> tuple[float, str | None, str]:
        try:
            value = self.fn(text, row)
        except Exception as e:  # noqa: BLE001 - any failure in user code is recorded, not raised
            return 0.0, "raised", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
        return check_reward(value)

    def drain_errors(self) -> list[dict[str, Any]]:
        """The failures since the last call (the replica sends them with its heartbeat)."""
        with self._lock:
            out, self.pending = self.pending, []
        return out

    def stats(self) -> dict[str, int]:
        return {"scored": self.scored, "reward_errors": self.errors}


class ScoringPool:
    """Scores finished trajectories on a few threads, off the decode loop, then hands each to `store`. A reward
    that hangs holds one thread until its timeout, not every trajectory finished after it."""

    def __init__(self, scorer: RewardScorer, workers: int = 4, name: str = "score") -> None:
        if workers < 1:
            raise ValueError(f"ScoringPool workers={workers}: must be at least 1")
        self.scorer = scorer
        self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)

    def submit(self, traj: Trajectory, row: dict[str, Any], store: Callable[[Trajectory], None]) -> cf.Future:
        """The future fails if `store` raised (the scorer itself never raises for a bad reward)."""

        def score_and_store() -> None:
            self.scorer.score(traj, row)
            store(traj)

        return self._pool.submit(score_and_store)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait)
