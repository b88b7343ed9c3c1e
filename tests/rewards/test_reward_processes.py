"""Rewards run in worker processes: one stuck in C (math-verify expanding a power tower, a big-integer power) is
killed at its timeout while every thread of the caller runs on and the rewards submitted meanwhile are scored; a
worker that dies costs its one call; closing leaves no process behind."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from laminar.data.records import Trajectory
from laminar.rewards.loader import RewardLoadError, RewardScorer, ScoringPool

FNS = "tests.rewards.reward_fns"
MATH_ROW = {"ground_truth": r"\sqrt{2}", "data_source": "lighteval/MATH"}  # a symbolic truth, as MATH's rows
TEXTS = [  # response i is TEXTS[i]: the power tower, then right answers
    r"So the answer is \boxed{9^{9^{9}}}",
    r"\boxed{\sqrt{2}}",
    r"The answer is \boxed{\sqrt 2}",
    r"\boxed{2^{1/2}}",
    r"\boxed{\sqrt{2}}",
]
# longest the caller's other threads may stand still: a reward holding the GIL in the caller's process stalled
# them for 17 s; a loaded machine's scheduling, for well under a second
MAX_GAP_S = 3.0


def decode(ids: list[int]) -> str:
    return TEXTS[ids[0]]


def traj(i: int) -> Trajectory:
    return Trajectory(f"{i}:0", i, 0, [1], [i], [0.0], version=0)


def workers_alive() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if p.name == "pebble_pool_worker"]


class Ticker:
    """A thread of the calling process waking every 10 ms: the longest gap between two wake-ups is the longest
    any thread of the process stood still (a reward holding the GIL in C freezes them all)."""

    def __init__(self) -> None:
        self.ticks = [time.monotonic()]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ticker", daemon=True)

    def _run(self) -> None:
        while not self._done.wait(0.01):
            self.ticks.append(time.monotonic())

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(5)
        self.ticks.append(time.monotonic())

    def max_gap(self) -> float:
        return max(b - a for a, b in zip(self.ticks, self.ticks[1:]))


def score_while_ticking(scorer: RewardScorer, rows: list[dict]) -> tuple[list[Trajectory], dict, float]:
    """Scores trajectory i with rows[i] the way a replica does (`ScoringPool`), trajectory 0 first; returns the
    trajectories, the time each was stored (seconds after the submission) and the longest stall of a thread."""
    t0 = time.monotonic()
    stored: dict[str, float] = {}
    trajs = [traj(i) for i in range(len(rows))]
    scoring = ScoringPool(scorer, workers=4)
    with Ticker() as ticker:
        try:
            futures = [
                scoring.submit(t, row, lambda t: stored.setdefault(t.traj_id, time.monotonic() - t0))
                for t, row in zip(trajs, rows)
            ]
            done, _ = cf.wait(futures, timeout=60)
            assert len(done) == len(futures) and all(f.exception() is None for f in futures)
            # the process that was killed has been replaced: the next call is scored
            assert scorer.score(traj(4), rows[-1]) == 1.0
        finally:
            scoring.shutdown()
    return trajs, stored, ticker.max_gap()


def check_killed_at_timeout(scorer: RewardScorer, trajs: list[Trajectory], stored: dict, gap: float) -> None:
    assert gap < MAX_GAP_S, f"the caller's threads stood still for {gap:.2f}s while the reward ran"
    assert [t.reward for t in trajs] == [0.0, 1.0, 1.0, 1.0]
    [error] = scorer.drain_errors()
    assert error["traj_id"] == "0:0" and error["error_kind"] == "timeout"
    # scored within seconds of its timeout (the first call also waits for the worker processes to start, slower
    # on a loaded machine), not when the reward would have ended by itself
    assert stored["0:0"] < scorer.timeout_s + 8.0
    # the rewards submitted after it were scored while it ran, not after it was killed
    assert max(stored[f"{i}:0"] for i in (1, 2, 3)) < stored["0:0"]
    assert not workers_alive()


def test_a_power_tower_answer_to_a_symbolic_truth_is_killed_at_its_timeout_while_the_caller_runs_on():
    """`\\boxed{9^{9^{9}}}` against `\\sqrt{2}` sends math-verify into 9**387420489, in C with the GIL held."""
    scorer = RewardScorer("laminar.rewards.math:default_score", decode, timeout_s=2.0)
    rows = [{**MATH_ROW, "row": i} for i in range(4)]
    check_killed_at_timeout(scorer, *score_while_ticking(scorer, rows))


def test_a_big_integer_power_is_killed_at_its_timeout_while_the_caller_runs_on():
    scorer = RewardScorer(f"{FNS}:bignum_on_row_zero", decode, timeout_s=1.0)
    rows = [{"row": i} for i in range(4)]
    check_killed_at_timeout(scorer, *score_while_ticking(scorer, rows))


@pytest.mark.parametrize(("row", "how"), [("exit", "exit code 3"), ("segfault", "killed by SIGSEGV")])
def test_a_worker_that_dies_costs_its_call_and_the_scorer_goes_on(row, how):
    scorer = RewardScorer(f"{FNS}:dies", decode, timeout_s=10.0)
    try:
        t = traj(1)
        assert scorer.score(t, {"row": row}) == 0.0
        [error] = scorer.drain_errors()
        assert (
            error["error_kind"] == "crashed"
            and how in error["error"]
            and "row " + row in t.meta["reward_error"]
        )
        assert scorer.score(traj(2), {"row": 2}) == 1.0
    finally:
        scorer.close()
    assert not workers_alive()


def test_a_reward_given_directly_must_be_importable_by_a_worker():
    with pytest.raises(RewardLoadError, match="module-level function or 'module:function'"):
        RewardScorer(lambda response, row: 1.0, decode)


def test_workers_start_at_the_first_call_and_end_with_the_pool():
    scoring = ScoringPool(RewardScorer(f"{FNS}:one", decode, processes=2))
    assert not workers_alive()  # nothing scored, nothing started
    future = scoring.submit(traj(1), {"row": 1}, lambda t: None)
    future.result(timeout=30)
    assert len(workers_alive()) == 2
    scoring.shutdown()
    assert not workers_alive()


def test_a_ray_workers_reward_workers_do_not_run_rays_worker_script_again(tmp_path):
    """A process whose main script is Ray's worker script (as a replica's is) spawns reward workers that leave
    that script alone: multiprocessing would run it again in each of them (its imports cost Ray's start)."""
    script = tmp_path / "ray" / "_private" / "workers" / "default_worker.py"
    script.parent.mkdir(parents=True)
    runs = tmp_path / "runs.txt"
    script.write_text(
        f"""
import os
with open({str(runs)!r}, "a") as f:
    f.write(f"{{__name__}}\\n")
if __name__ == "__main__":
    from laminar.data.records import Trajectory
    from laminar.rewards.loader import RewardScorer

    scorer = RewardScorer("tests.rewards.reward_fns:one", lambda ids: "abc", processes=1)
    print(scorer.score(Trajectory("0:0", 0, 0, [1], [1], [0.0], version=0), {{}}))
    scorer.close()
"""
    )
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert out.returncode == 0 and out.stdout.strip() == "1.0", out.stderr[-2000:]
    assert runs.read_text().split() == [
        "__main__"
    ]  # once, as the parent's main: never as a child's __mp_main__
