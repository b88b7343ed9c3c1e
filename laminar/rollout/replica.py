"""A rollout replica: one engine, generating whole batches with one weight version each.

The loop is the design's, section 3: pull the newest version from the node's relay, ask the manager for prompt
groups, decode them to the end (streaming progress to the partial response pool, scoring finished trajectories
off the decode loop, their rewards in the scorer's worker processes), and start again. The manager's repack and
recovery commands (export, import) are applied by the loop thread between two engine steps, so the engine is only
ever touched by one thread. Mixed in: the moves (`moves.py`) and the store path of finished trajectories
(`storing.py`).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from laminar.data.records import PromptGroup, ReplicaSnapshot, Trajectory, is_eval
from laminar.rewards.loader import ScoringPool
from laminar.rollout.inflight import InFlight, sample_seed
from laminar.rollout.moves import Moves, progress_update
from laminar.rollout.storing import Storing, describe_error

# threads a replica scores finished trajectories on: each decodes a response and waits while its reward runs in
# one of the scorer's worker processes (`laminar.rewards.loader.REWARD_PROCESSES`)
SCORE_WORKERS = 4
# Longest a replica waits for the partial response pool to record a tool call before the call runs.
POOL_ACK_S = 30.0


@dataclass
class _Command:
    fn: Callable[[], Any]
    done: cf.Future = field(default_factory=cf.Future)


class RolloutReplica(Moves, Storing):
    """Plain class; `laminar.rollout.actor` wraps it in a threaded Ray actor."""

    def __init__(
        self,
        replica_id: int,
        make_engine: Callable[[], Any],
        *,
        manager: Any,
        relay: Any,
        partial_pool: Any,
        buffer: Any,
        scorer: Any,
        sampling: dict[str, Any],
        run_seed: int,
        progress_every: int = 8,
        heartbeat_s: float = 1.0,
        timeout_s: float = 120.0,
        torch_threads: int = 1,
        interrupt_on_update: bool = False,
        tools: Callable[[], Any] | None = None,
    ) -> None:
        """`tools`: builds the tool-turn driver (`laminar.tools.turns.ToolTurns`) when the task calls tools."""
        torch.set_num_threads(
            torch_threads
        )  # Ray gives fractional-CPU actors one OMP thread; say so explicitly
        self.id = replica_id
        self.engine = make_engine()
        self.manager, self.relay, self.partial_pool, self.buffer = manager, relay, partial_pool, buffer
        self.scorer = scorer
        self.sampling = sampling
        self.run_seed = run_seed
        self.progress_every = progress_every
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self.interrupt_on_update = interrupt_on_update  # the `partial` baseline; Laminar never does this
        self.inflight: dict[str, InFlight] = {}
        # finished, being scored or stored: in no engine and not yet in the buffer (a restarted manager's check)
        self.finishing: set[str] = set()
        self.requests = 0  # calls for work so far: a call the manager's loss cut short is asked again as is
        self.tools = tools() if tools is not None else None
        if self.tools is not None:  # the benchmark's tool workload scripts its calls per row
            self.tools.script_of = self._tool_script
        self.commands: queue.Queue[_Command] = queue.Queue()
        # a reward that hangs until its timeout holds one worker process, not every group after it; `stop` ends them
        self.scoring = ScoringPool(scorer, SCORE_WORKERS, name=f"score-{replica_id}")
        self.stop_event = threading.Event()
        self.tokens_generated = 0
        self.busy_s = 0.0
        self.error: str | None = None  # the loop's traceback once it raised: the replica is dead
        self.error_line = ""
        self.error_kind = ""
        self._last_beat = 0.0
        self._reader: Any = None  # SlotReader when the engine is on CUDA
        self._newest_ref: Any = None  # partial rollout: the relay's answer to "newest version?", in flight
        self._thread = threading.Thread(target=self._main, name=f"replica-{replica_id}", daemon=True)
        # scored trajectories wait here for the storer, which sends all that wait in one call to the buffer
        self._scored: queue.Queue[Trajectory | None] = queue.Queue()
        self._storer = threading.Thread(target=self._store_loop, name=f"store-{replica_id}", daemon=True)

    def _tool_script(self, rid: str) -> dict[str, Any] | None:
        """The benchmark workload's scripted calls of a request (`laminar.tasks.lengths`), or None."""
        state = self.inflight.get(rid)
        return state.group.meta.get("tool_script") if state is not None else None

    # ---- called by the actor's other threads -------------------------------------------------------------
    def start(self) -> None:
        self._storer.start()
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        self._thread.join(timeout_s)
        self.scoring.shutdown(wait=True)
        self._scored.put(None)  # after everything scored: the storer sends it, then ends
        self._storer.join(timeout_s)
        if self.tools is not None:
            self.tools.shutdown()
        try:  # a last report, waited for, so reward errors scored since the last heartbeat are counted
            ray.get(self._beat(force=True), timeout=timeout_s)
        except (ray.exceptions.RayError, TimeoutError):
            pass  # the manager is gone; nothing is left to report to
        if self._reader is not None and not self._thread.is_alive():
            self._reader.close()

    def run_in_loop(self, fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        """Run `fn` on the loop thread between two engine steps and wait for its result."""
        if self.error is not None:  # nobody is left to run it
            raise RuntimeError(f"replica {self.id}: its generation loop has stopped ({self.error_line})")
        cmd = _Command(fn)
        self.commands.put(cmd)
        return cmd.done.result(timeout=timeout_s or self.timeout_s)

    def snapshot(self) -> ReplicaSnapshot:
        """The replica's state. Once its loop has died no heartbeat will send the reward errors scored since
        the last one, so the snapshot takes them (the supervisor logs them with the loop's error)."""
        for _ in range(3):  # read from another thread than the loop's; retry if it changed under us
            try:
                snap = self._snapshot()
                break
            except RuntimeError:
                continue
        else:
            snap = self._snapshot()
        if self.error is not None:
            snap.reward_errors = self.scorer.drain_errors()
        return snap

    def _snapshot(self) -> ReplicaSnapshot:
        stats = self.engine.stats()
        counters = vars(stats) | {
            "tokens_generated": self.tokens_generated,
            "draft_s": round(stats.draft_s, 4),
        }
        return ReplicaSnapshot(
            replica=self.id,
            **counters,
            busy_s=round(self.busy_s, 4),
            inflight=sorted(r for r, st in self.inflight.items() if not is_eval(st.group.group_id)),
            finishing=sorted(self.finishing),  # read after `inflight`: `_finish` adds here before it pops
            # evaluation requests finish where they started: repack never moves them; parked ones are listed
            # too (an export waits for their calls)
            requests=[
                (rid, self._blocks(rid))
                for rid, st in sorted(self.inflight.items())
                if not is_eval(st.group.group_id)
            ],
            tool_reruns=self.tools.reruns if self.tools is not None else 0,
            tool_calls=self.tools.calls if self.tools is not None else None,
            tool_queued_s=round(self.tools.queued_s, 4) if self.tools is not None else None,
            error=self.error,
            error_line=self.error_line,
            error_kind=self.error_kind,
        )

    def _blocks(self, rid: str) -> int:
        """KV blocks a request holds (prompt plus output so far): what repack must find room for."""
        state = self.inflight[rid]
        try:
            num_tokens = len(state.group.prompt_ids) + len(self.engine.progress(rid)[0])
        except KeyError:  # finished between the two reads
            return 0
        return -(-num_tokens // self.engine.block_size)

    # ---- the loop thread --------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            while not self.stop_event.is_set():
                self._apply_commands()
                if not self.engine.has_unfinished():
                    self._pull()
                    self.requests += 1
                    groups = ray.get(
                        self.manager.next_work.remote(self.id, self.engine.version, self.requests),
                        timeout=self.timeout_s,
                    )
                    self._add(groups)
                self._decode()
        except ray.exceptions.ActorDiedError:
            # The manager or a pool is dead for good (Ray restarts them while the run lasts): the run is over,
            # and this process, which outlives the manager that made it, ends.
            os._exit(0)
        except Exception as e:  # the replica is dead: the manager sees the error and replaces it
            if self.error is None:
                self.error_line, self.error_kind = describe_error(e)
                self.error = traceback.format_exc()
            self._beat(force=True)

    def _apply_commands(self) -> None:
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return
            try:
                cmd.done.set_result(cmd.fn())
            except Exception as exc:  # handed to the caller, the loop goes on
                cmd.done.set_exception(exc)

    def _pull(self) -> None:
        from laminar.relay.pull import SlotReader, pull_latest, pull_slot

        load_slot = getattr(self.engine, "load_slot", None)  # a tensor-parallel replica's: every rank maps it
        try:
            if load_slot is not None:
                pulled = pull_slot(self.relay, load_slot, self.engine.version, timeout=self.timeout_s)
            elif getattr(self.engine, "device", None) is not None and self.engine.device.type == "cuda":
                # keep the slot mappings, registered with CUDA, across pulls (a pageable copy is ~10x slower)
                if self._reader is None:
                    self._reader = SlotReader(self.relay, timeout=self.timeout_s)
                elif self._reader.relay is not self.relay:
                    self._reader.set_relay(self.relay)
                pulled = self._reader.pull(self.engine.load_weights, self.engine.version)
            else:
                pulled = pull_latest(
                    self.relay, self.engine.load_weights, self.engine.version, timeout=self.timeout_s
                )
        except (
            ray.exceptions.RayActorError,
            ray.exceptions.ActorUnavailableError,
        ):  # our relay died; the manager gives us a new one, we pull later
            return
        if pulled is not None:
            version, seconds = pulled
            self.manager.record_pull.remote(self.id, version, seconds, time.time())

    def _add(self, groups: list[PromptGroup]) -> None:
        from laminar.engine import SamplingParams

        self.engine.reset_peak()
        now = time.time()
        for group in groups:
            for i in range(group.n):
                rid = group.traj_id(i)
                # a row may fix its own sampling (the length-controlled benchmark workload does)
                sampling = {**self.sampling, **group.meta.get("sampling", {})}
                params = SamplingParams(seed=sample_seed(self.run_seed, rid), **sampling)
                self.engine.add_request(rid, group.prompt_ids, params)
                self.inflight[rid] = InFlight(group, i, self.engine.version, now)
            # after `inflight`: what the partial pool lists here, a snapshot lists too
            if not is_eval(group.group_id):  # evaluation work is not recovered: the evaluator counts it lost
                self.partial_pool.start.remote(group, self.id, self.engine.version)

    def _decode(self) -> None:
        """Step the engine until it drains; commands (repack, recovery) are applied between steps."""
        steps = 0
        while self.engine.has_unfinished() and not self.stop_event.is_set():
            t = time.perf_counter()
            out = self.engine.step()
            self.busy_s += time.perf_counter() - t
            self.tokens_generated += sum(len(t) for t in out.new_tokens.values())
            for fin in out.finished:
                self._finish(fin)
            if self.tools is not None:  # park turns that end in a call; resume those whose call came back
                self.tools.after_step(self.engine, out, start=False)
                parked = self.tools.changed()
                if parked:  # write-ahead: the pool records each call before it runs, so a re-run is counted
                    self._report_progress(parked, wait=True)
                self.tools.start_parked()
                for fin in self.tools.poll(self.engine, wait_s=0.0 if out.new_tokens else 0.02):
                    self._finish(fin)
                resumed = self.tools.changed()
                if resumed:  # the pool learns every result given at once
                    self._report_progress(resumed)
            steps += 1
            if steps % self.progress_every == 0:
                self._report_progress()
                if self.interrupt_on_update:
                    self._resume_on_newer_version()
            self._beat(force=steps == 2)  # one sample of every batch at full KV, right after its prefill
            self._apply_commands()
        self._beat(force=True)

    def _resume_on_newer_version(self) -> None:
        """Partial rollout: once the relay holds a newer version, interrupt everything in flight, load it,
        re-prefill and go on. The decode loop never waits for the relay: each check reads the answer to the
        previous question if it has come (a blocking round trip every few decode steps cost the baseline
        several percent of its decode time on GPU), then asks again."""
        if self._newest_ref is not None:
            ready, _ = ray.wait([self._newest_ref], timeout=0)
            if not ready:
                return
            try:
                newest = ray.get(self._newest_ref)
            except (
                ray.exceptions.RayActorError,
                ray.exceptions.ActorUnavailableError,
            ):  # our relay died; the manager gives us a new one
                newest = None
            self._newest_ref = None
            if newest is not None and newest > self.engine.version:
                exported = [self.engine.export_request(rid) for rid in list(self.inflight)]
                self._pull()
                for e in exported:
                    self.engine.import_request(e)
        self._newest_ref = self.relay.newest_version.remote()

    def _report_progress(self, rids: set[str] | None = None, wait: bool = False) -> None:
        """New tokens (with log-probs and loss mask) to the partial response pool, with the tool state they end
        in: a recovery continues after the last turn the pool knows, with the result of its call if that came
        back. `rids`: these requests (their tool state changed), reported even with no new token. `wait`: return
        once the pool has them (a pool that does not answer in `POOL_ACK_S` is not waited for longer)."""
        updates, at = {}, {}
        for rid in self.inflight if rids is None else rids:
            state = self.inflight.get(rid)
            if state is None or is_eval(state.group.group_id):
                continue
            update = progress_update(self.engine, self.tools, rid, state.reported)
            if update[0] or rids is not None:
                updates[rid], at[rid] = update, state.reported
                state.reported += len(update[0])
        if updates:  # with each one's offset: a call sent again after the pool's loss adds its tokens once
            ref = self.partial_pool.progress.remote(updates, at)
            if wait:
                try:
                    ray.get(ref, timeout=POOL_ACK_S)
                except ray.exceptions.GetTimeoutError:
                    pass  # the calls start regardless; a re-run after a death in this window goes uncounted

    def _beat(self, force: bool = False) -> Any:
        now = time.time()
        if force or now - self._last_beat >= self.heartbeat_s:
            self._last_beat = now
            report = self.snapshot()
            report.reward_errors = report.reward_errors + self.scorer.drain_errors()
            return self.manager.heartbeat.remote(report, now)
        return None
