"""A replica's finished trajectories on their way to the experience buffer: scored off the decode loop (the reward
in the scorer's worker processes), then stored in batches by one thread; a store that fails declares the replica
dead, so the manager recovers what it owes instead of the trajectories being lost silently."""

from __future__ import annotations

import concurrent.futures as cf
import queue
import time
import traceback
from typing import Any

import ray

from laminar.data.records import Trajectory, is_eval


def describe_error(exc: BaseException) -> tuple[str, str]:
    """(one line, signature) of an error: the line a person reads, and what makes two failures "the same" (its
    type and the place it was raised, not its message, which often names a request id)."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    line = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
    return line, f"{type(exc).__name__} at {where}"


class Storing:
    """`RolloutReplica`'s store path (its scoring pool, buffer, partial pool and error fields)."""

    def _finish(self, fin: Any) -> None:
        self.finishing.add(fin.request_id)
        state = self.inflight.pop(fin.request_id)
        if self.tools is not None:
            self.tools.forget(fin.request_id)
        traj = Trajectory(
            traj_id=fin.request_id,
            group_id=state.group.group_id,
            sample_idx=state.sample_idx,
            prompt_ids=list(state.group.prompt_ids),
            response_ids=list(fin.output_token_ids),
            logprobs=list(fin.logprobs),
            version=state.version,
            finish_reason=fin.finish_reason,
            token_versions=list(fin.token_versions) if len(set(fin.token_versions)) > 1 else [],
            reprefill_tokens=fin.reprefill_tokens,
            loss_mask=list(fin.loss_mask),
            replica=self.id,
            t_start=state.t_start,
            t_end=time.time(),
        )
        # a failing reward scores 0 and is noted on the trajectory; only a failed store fails the future
        self.scoring.submit(traj, state.group.meta, self._store).add_done_callback(self._stored)

    def _stored(self, future: cf.Future) -> None:
        """A finished trajectory that did not reach the buffer would be lost silently: the replica is declared
        dead instead, so the manager recovers the work it owes and replaces it."""
        exc = None if future.cancelled() else future.exception()
        if exc is not None and self.error is None:
            self.error_line, self.error_kind = describe_error(exc)
            self.error = "".join(traceback.format_exception(exc))

    def _store(self, traj: Trajectory) -> None:
        self._scored.put(traj)

    def _store_loop(self) -> None:
        """Scored trajectories to the experience buffer: everything waiting goes in one call, so a batch whose
        samples finish together costs a few round trips, not one a sample. A store that fails declares the
        replica dead (its trajectories would be lost silently otherwise): the manager recovers what it owes."""
        done = False
        while not done:
            batch = [self._scored.get()]
            while True:
                try:
                    batch.append(self._scored.get_nowait())
                except queue.Empty:
                    break
            done = None in batch
            trajs = [t for t in batch if t is not None]
            try:
                self._send(trajs)
            except Exception as exc:  # noqa: BLE001 - recorded as the replica's error, which the manager acts on
                if self.error is None:
                    self.error_line, self.error_kind = describe_error(exc)
                    self.error = "".join(traceback.format_exception(exc))

    def _send(self, trajs: list[Trajectory]) -> None:
        evals = [t for t in trajs if is_eval(t.group_id)]  # kept aside for the evaluator, never trained on
        train = [t for t in trajs if not is_eval(t.group_id)]
        if evals:
            ray.get(self.buffer.add_eval_many.remote(evals), timeout=self.timeout_s)
        if train:
            ray.get(self.buffer.add_many.remote(train), timeout=self.timeout_s)
            self.partial_pool.finish_many.remote([t.traj_id for t in train])
        self.finishing.difference_update(t.traj_id for t in trajs)
