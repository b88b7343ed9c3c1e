"""Reward functions plug in by dotted path (`module:function`) and never lose a trajectory when they fail.

Only a finite number reaches the trainer: a reward function that raises, runs past its timeout, takes its process
down or returns anything but a finite real number (a string, None, NaN, inf) scores 0.0, and the failure is kept
as a small record (trajectory, row, kind, message) that the replica reports and the run logs and counts.

Reward functions run in a few worker processes, never in the caller's. A reward is user code, and one that holds
the GIL inside C (math-verify expanding `\\boxed{9^{9^{9}}}`, any big-integer power) would freeze every thread of
the replica, its decode loop and heartbeat included, for as long as it runs; a thread cannot be stopped, a
process can. A call that runs past `timeout_s` has its process killed, at once even mid-C-call, and replaced.
The text is decoded here: a worker gets (text, row) and sends back (reward, error kind, message).

Two signatures are accepted: Laminar's `fn(response, row)`, and verl's `compute_score(data_source,
solution_str, ground_truth, extra_info)` (told apart by its parameter names: `VerlReward`). Either may return a
number or, as verl allows, a dict whose "score" is the number."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import importlib.machinery
import inspect
import math
import multiprocessing
import numbers
import os
import pickle
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from pebble import ProcessExpired, ProcessPool

from laminar.data.records import Trajectory
from laminar.plugin import load_function

RewardFn = Callable[[str, dict[str, Any]], float]
DEFAULT_REWARD = "laminar.rewards.reverse:reverse_reward"
# why a reward became 0.0: the function raised, ran too long, its process died (a crash, os._exit, killed),
# it returned a non-number, it returned NaN or inf
ERROR_KINDS = ("raised", "timeout", "crashed", "not_a_number", "not_finite")
# Worker processes per scorer (one scorer per replica). A call takes milliseconds, so two keep up with a replica;
# two, not one, so that a reward hung until its timeout leaves one scoring. Each is an interpreter with the
# reward's imports, on every replica: in a Ray actor, whose worker script it imports too, ~105 MB with
# math-verify and sympy, and its first call comes about a second after the pool starts
# (`results/reward-isolation/`).
REWARD_PROCESSES = 2  # the default of `task.reward_processes`


class RewardLoadError(ValueError):
    """The dotted path does not name a callable, or a callable cannot reach a worker process."""


# verl's reward signature: `compute_score(data_source, solution_str, ground_truth, extra_info=None)`, called with
# keywords; a function naming `solution_str` is one (verl's own scorers take a subset, e.g. gsm8k's)
VERL_PARAMS = ("data_source", "solution_str", "ground_truth", "extra_info")


class VerlReward:
    """A verl-style `compute_score` as a `(response, row)` reward: the row's `data_source`, `ground_truth` and
    `extra_info` (`laminar.data.dataset.normalise_row` puts verl's `reward_model.ground_truth` there) passed as
    the keywords it names. Module-level, and holding the function by reference, so it pickles to a worker."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        params = inspect.signature(fn).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        self.names = tuple(n for n in VERL_PARAMS if takes_any or n in params)

    def __call__(self, response: str, row: dict[str, Any]) -> Any:
        given = {
            "data_source": row.get("data_source", ""),
            "solution_str": response,
            "ground_truth": row.get("ground_truth"),
            "extra_info": row.get("extra_info") or {},
        }
        return self.fn(**{n: given[n] for n in self.names})

    def __repr__(self) -> str:
        return f"VerlReward({self.fn.__module__}:{self.fn.__qualname__})"


def as_reward(fn: Callable[..., Any]) -> RewardFn:
    """`fn` as a `(response, row)` reward: itself, or wrapped in `VerlReward` when its parameters are verl's."""
    if isinstance(fn, VerlReward):
        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable without a signature: taken as (response, row)
        return fn
    return VerlReward(fn) if "solution_str" in params else fn


def load_reward(path: str) -> RewardFn:
    """`package.module:function`: a function of (response_text, row), or verl's `compute_score(data_source,
    solution_str, ground_truth, extra_info)`; either returns a number (or a dict with a "score")."""
    return as_reward(load_function(path, "reward", DEFAULT_REWARD, RewardLoadError))


def check_reward(value: Any) -> tuple[float, str | None, str]:
    """(reward, error kind or None, message): a finite real number passes as a float, anything else is 0.0. A
    dict with a "score" (verl's richer return) is its score."""
    if isinstance(value, Mapping) and "score" in value:
        value = value["score"]
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


# ---- in a worker process ---------------------------------------------------------------------------------
@functools.cache
def _reward_of(spec: str | bytes) -> RewardFn:
    """The reward a worker runs, loaded once per process: by dotted path, or a pickled module-level function."""
    return load_reward(spec) if isinstance(spec, str) else as_reward(pickle.loads(spec))


def _start_worker(spec: str | bytes) -> None:
    """A worker's start: the reward's module imported before any call's timeout runs, and SIGTERM back to its
    default action, which the kernel carries out even while C code holds the GIL (a Python handler would wait
    for it)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        _reward_of(spec)
    except Exception:  # noqa: BLE001 - the first call loads it again and reports the error with its row
        pass


def _score(spec: str | bytes, text: str, row: dict[str, Any]) -> tuple[float, str | None, str]:
    """One call, in a worker: (reward, error kind or None, message), plain values whatever the function returned."""
    try:
        value = _reward_of(spec)(text, row)
    except BaseException as e:  # noqa: BLE001 - any failure in user code is recorded, even SystemExit
        return 0.0, "raised", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
    return check_reward(value)


# ---- in the caller ---------------------------------------------------------------------------------------
def _spec_of(fn: RewardFn | str) -> str | bytes:
    """What a worker loads the reward from: its dotted path, or the function pickled by reference."""
    if isinstance(fn, str):
        return fn
    try:
        return pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise RewardLoadError(
            f"reward {fn!r}: rewards run in worker processes, which import a function by its module and name; "
            f"give a module-level function or 'module:function', not a lambda or a nested function ({e})"
        ) from e


def _died(e: ProcessExpired) -> str:
    code = e.exitcode
    how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
    return f"its worker process died ({how}); the call was lost and the process replaced"


def _stop(pool: ProcessPool) -> None:
    pool.stop()
    pool.join()


def _spawn_without_rays_worker_script() -> None:
    """Where this process is a Ray worker: its spawned reward workers skip running Ray's worker script again.
    multiprocessing runs the parent's main script in each spawned child (as `__mp_main__`, for functions defined
    there); a Ray worker's is Ray's own, whose imports (Ray: 0.7 of a reward worker's 0.9 CPU-seconds to start)
    a reward worker never uses. A main module whose spec is named `__main__` is left alone in the child."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or ""
    if (
        main is not None
        and main.__spec__ is None
        and path.endswith(os.path.join("ray", "_private", "workers", "default_worker.py"))
    ):
        main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)


class RewardScorer:
    """Scores trajectories. A failure gives 0.0, is noted on the trajectory (`meta["reward_error"]`) and queued
    for the replica's next report (`drain_errors`), so one bad row never kills a rollout or drops a group.

    Calls run in `processes` worker processes (spawned, never forked: the caller has threads and may hold
    CUDA), started at the first call and kept; `close` ends them. `timeout_s` counts from when a worker takes
    the call, not while it waits for one. Safe to call from several threads at once (`ScoringPool`)."""

    def __init__(
        self,
        fn: RewardFn | str,
        decode: Callable[[list[int]], str],
        timeout_s: float | None = None,
        decode_turns: Callable[[list[int], list[int]], str] | None = None,
        processes: int = REWARD_PROCESSES,
    ) -> None:
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"reward timeout_s={timeout_s}: must be > 0 (or None for no limit)")
        if processes < 1:
            raise ValueError(f"reward processes={processes}: must be at least 1")
        self.fn = load_reward(fn) if isinstance(fn, str) else fn  # a bad path fails here, not in a worker
        named = hasattr(fn, "__qualname__")  # a function, or a callable object (`VerlReward`)
        self.name = fn if isinstance(fn, str) else f"{fn.__module__}:{fn.__qualname__}" if named else repr(fn)
        self._spec = _spec_of(fn)
        self.decode = decode
        # a response with tool outputs (a loss mask) as one text, its turns and outputs in order
        # (`TaskCodec.response_text`); without it such a response is read by `decode` alone
        self.decode_turns = decode_turns
        self.timeout_s = timeout_s
        self.processes = processes
        self.errors = 0
        self.scored = 0
        self.pending: list[dict[str, Any]] = []  # failures not yet reported
        self._lock = threading.Lock()  # scoring (several threads) and reporting run on different threads
        self._pool: ProcessPool | None = None
        self._stop_pool: weakref.finalize | None = None
        self._calls: set[cf.Future] = set()  # in a worker or waiting for one: `close` ends them

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
        future = self._schedule(text, row)
        try:
            return future.result()
        except TimeoutError:
            limit = f"{self.timeout_s:g}s (task.reward_timeout_s)"
            return 0.0, "timeout", f"did not return within {limit}; its worker process was killed"
        except ProcessExpired as e:
            return 0.0, "crashed", _died(e)
        except BrokenProcessPool as e:  # a worker died between calls: the next call starts a new pool
            return 0.0, "crashed", f"the worker processes failed before the call ran ({e})"
        except cf.CancelledError:
            return 0.0, "crashed", "the scorer was closed before the call returned"
        except Exception as e:  # noqa: BLE001 - never reached a worker: e.g. the row does not pickle
            return 0.0, "raised", f"{type(e).__name__}: {e}"
        finally:
            with self._lock:
                self._calls.discard(future)

    def _schedule(self, text: str, row: dict[str, Any]) -> cf.Future:
        with self._lock:
            if self._pool is None or not self._pool.active:  # the first call, or the pool broke
                if self._stop_pool is not None:
                    self._stop_pool()
                _spawn_without_rays_worker_script()
                self._pool = ProcessPool(
                    max_workers=self.processes,
                    initializer=_start_worker,
                    initargs=(self._spec,),
                    context=multiprocessing.get_context("spawn"),
                )
                self._stop_pool = weakref.finalize(self, _stop, self._pool)  # also when dropped unclosed
            future = self._pool.schedule(_score, (self._spec, text, row), timeout=self.timeout_s)
            self._calls.add(future)
        return future

    def close(self) -> None:
        """End the worker processes; a call still in one scores 0.0 ("crashed"). A later call starts new ones."""
        with self._lock:
            stop, self._pool, self._stop_pool = self._stop_pool, None, None
            calls, self._calls = self._calls, set()
        for future in calls:
            future.cancel()
        if stop is not None:
            stop()

    def drain_errors(self) -> list[dict[str, Any]]:
        """The failures since the last call (the replica sends them with its heartbeat)."""
        with self._lock:
            out, self.pending = self.pending, []
        return out

    def stats(self) -> dict[str, int]:
        return {"scored": self.scored, "reward_errors": self.errors}


class ScoringPool:
    """Scores finished trajectories off the decode loop, then hands each to `store`. Its threads decode the text
    and wait for the scorer's processes, where rewards run: a reward that hangs holds one process until its
    timeout, and none of the caller's threads."""

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
        """Stop taking trajectories and end the scorer's processes (with `wait`, once everything is scored)."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
        self.scorer.close()
