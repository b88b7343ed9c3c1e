"""One simulated rollout replica: continuous batching at trajectory granularity.

Between two events the batch is fixed, so every running request gains one token per decode step and a step
costs `a(n) + b * context`, where the context grows by n tokens a step. The time for s steps is then
`a*s + b*(C0*s + n*s^2/2)`, and its inverse is a quadratic: the replica jumps from one event (a request
finishes, the KV cache fills, work arrives or leaves) to the next without simulating tokens. Progress is a
per-replica step counter; a request stores the counter value at which it finishes.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class Traj:
    """One trajectory of a group; `version` is the policy that started it (the one staleness counts)."""

    tid: int
    group: Group
    prompt: int
    target: int  # response tokens it will have when it finishes
    version: int
    generated: float = 0.0
    replica: Replica | None = None
    offset: float = 0.0  # context = offset + replica.steps while running
    finish_step: float = 0.0
    admit_seq: int = 0
    versions: int = 1  # policy versions that produced its tokens (> 1 only under partial rollout)
    reprefill: float = 0.0  # tokens prefilled again after an interruption, a move or a preemption
    t_start: float = 0.0
    t_end: float = -1.0
    # tool calls: the response tokens before each (its earlier calls' outputs counted), their latencies, and
    # the tokens each appends; `next_call` is the first not yet made
    calls: tuple[int, ...] = ()
    latencies: tuple[float, ...] = ()
    out_tokens: int = 0
    next_call: int = 0
    call_done_at: float = -1.0  # parked: when its call's output comes back (kept when it moves)
    park_token: int = 0  # tells a stale return event from the current one
    kv_lost: bool = False  # taken while parked: its context must be prefilled again where it resumes
    resume_tokens: float = 0.0  # tokens to prefill when it is next admitted after a call (0: the usual rule)

    @property
    def stop(self) -> int:
        """Where decoding next stops: its next tool call, or its end."""
        return self.calls[self.next_call] if self.next_call < len(self.calls) else self.target

    def rewind(self) -> None:
        """Back to its prompt (a restart): no tokens, no calls made."""
        self.generated = 0.0
        self.next_call, self.call_done_at, self.kv_lost, self.resume_tokens = 0, -1.0, False, 0.0


@dataclass(eq=False, slots=True)
class Group:
    """The n samples of one prompt; dispatched whole to one replica, so they share a version."""

    gid: int
    version: int
    trajs: list[Traj] = field(default_factory=list)
    pending: int = 0
    t_done: float = -1.0

    @property
    def tokens(self) -> int:
        return sum(t.prompt + t.target for t in self.trajs)


@dataclass(slots=True)
class Busy:
    """Seconds a replica spent on each activity, plus the batch-size integral for mean running batch."""

    decode: float = 0.0
    prefill: float = 0.0
    reprefill: float = 0.0
    weights: float = 0.0
    repack: float = 0.0
    batch_seconds: float = 0.0
    tokens: float = 0.0
    preemptions: int = 0
    tool_wait: float = 0.0  # seconds with requests parked on tool calls and none decoding


class Replica:
    """A generation engine at trajectory granularity; the cluster calls it, it calls back on finish/drain."""

    def __init__(
        self,
        rid: int,
        machine: int,
        *,
        decode_base: list[float],
        per_token_s: float,
        prefill_s: Callable[[float], float],
        kv_capacity: int,
        max_seqs: int,
        schedule_event: Callable[[float, Callable[[int], None], int], None],
        on_finish: Callable[[Traj, Replica], None],
        on_drained: Callable[[Replica], None],
        tool_workers: int = 4,
    ) -> None:
        self.rid, self.machine = rid, machine
        self.decode_base, self.per_token_s, self.prefill_cost = decode_base, per_token_s, prefill_s
        self.kv_capacity, self.max_seqs = kv_capacity, max_seqs
        self._schedule, self._on_finish, self._on_drained = schedule_event, on_finish, on_drained
        self.version = 0
        self.alive = True
        self.running: dict[Traj, None] = {}  # insertion order = admission order (preempt the newest)
        self.waiting: deque[Traj] = deque()
        self.parked: dict[Traj, None] = {}  # waiting for a tool call's output; their KV stays
        self.parked_kv = 0.0
        # when each of the replica's tool workers (`task.tool_workers`) is next free: calls queue for them
        self.tool_free = [0.0] * tool_workers
        self._heap: list[tuple[float, int, Traj]] = []
        self.steps = 0.0
        self.offsets = 0.0  # sum of running offsets: KV tokens = offsets + n * steps
        self.t_last = 0.0
        self.stall_until = 0.0
        self.peak_kv = 0.0
        self.busy = Busy()
        self._token = 0
        self._target = 0.0
        self._admits = 0

    # ---- state -------------------------------------------------------------------------------------------

    @property
    def kv_used(self) -> float:
        return self.offsets + len(self.running) * self.steps + self.parked_kv

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting and not self.parked

    def context(self, traj: Traj) -> float:
        return traj.offset + self.steps

    # ---- time --------------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Bring the step counter to `now` (decode runs only outside stalls)."""
        start = max(self.t_last, self.stall_until)
        n = len(self.running)
        if not n and self.parked and now > start:
            self.busy.tool_wait += now - start
        if n and now > start:
            dt = now - start
            p = self.decode_base[n] + self.per_token_s * (self.offsets + n * self.steps)
            s = 2 * dt / (p + math.sqrt(p * p + 2 * self.per_token_s * n * dt))
            self.steps += s
            self.busy.decode += dt
            self.busy.batch_seconds += n * dt
            self.busy.tokens += n * s
            kv = self.kv_used
            if kv > self.peak_kv:
                self.peak_kv = kv
        if now > self.t_last:
            self.t_last = now

    def stall(self, now: float, seconds: float, kind: str) -> None:
        """Pause decoding for `seconds` (prefill, weight transfer, repack); call after `advance(now)`."""
        if seconds <= 0:
            return
        self.stall_until = max(self.stall_until, now) + seconds
        setattr(self.busy, kind, getattr(self.busy, kind) + seconds)

    def _time_for(self, ds: float) -> float:
        n = len(self.running)
        c0 = self.offsets + n * self.steps
        return self.decode_base[n] * ds + self.per_token_s * (c0 * ds + n * ds * ds / 2)

    def reschedule(self, now: float) -> None:
        """Post the next event: the earliest finish or the moment the KV cache fills."""
        self._token += 1
        n = len(self.running)
        if not n:
            return
        heap = self._heap
        while heap and (heap[0][2].replica is not self or heap[0][2].finish_step != heap[0][0]):
            heapq.heappop(heap)
        ds = heap[0][0] - self.steps
        room = self.kv_capacity - self.kv_used
        if room < ds * n:
            ds = max(room / n, 0.0)
        self._target = self.steps + max(ds, 0.0)
        start = max(now, self.stall_until)
        self._schedule(start + self._time_for(max(ds, 0.0)), self._on_event, self._token)

    def _on_event(self, token: int, now: float) -> None:
        if token != self._token or not self.alive:
            return
        self.advance(now)
        self.steps = max(self.steps, self._target)
        heap = self._heap
        while heap and heap[0][0] <= self.steps + 1e-9:
            step, _, traj = heapq.heappop(heap)
            if traj.replica is self and traj.finish_step == step:
                self._remove(traj)
                if traj.stop < traj.target:
                    self._park(traj, now)
                    continue
                traj.generated = traj.target
                traj.t_end = now
                self._on_finish(traj, self)
        while self.running and self.kv_used >= self.kv_capacity - 1e-3:  # full: preempt, never spin
            newest = next(reversed(self.running))
            self.take(newest)
            self.waiting.appendleft(newest)
            self.busy.preemptions += 1
        self.admit(now)
        self.reschedule(now)
        if self.idle:
            self._on_drained(self)

    # ---- requests ----------------------------------------------------------------------------------------

    def _remove(self, traj: Traj) -> None:
        del self.running[traj]
        self.offsets -= traj.offset
        traj.replica = None

    def _park(self, traj: Traj, now: float) -> None:
        """The request made its next tool call: out of the batch, its KV kept, back when the output is."""
        traj.generated = traj.stop
        if traj.call_done_at < 0:  # a fresh call, on the first free worker (a moved one keeps its time)
            start = max(now, heapq.heappop(self.tool_free))
            traj.call_done_at = start + traj.latencies[traj.next_call]
            heapq.heappush(self.tool_free, traj.call_done_at)
        traj.park_token += 1
        self.parked[traj] = None
        self.parked_kv += traj.prompt + traj.generated
        self._schedule(max(now, traj.call_done_at), self._return, (traj, traj.park_token))

    def _return(self, arg: tuple[Traj, int], now: float) -> None:
        """A tool call's output: append it and queue the request first; only the appended tokens are
        prefilled (its KV stayed), or its whole context when it moved while parked."""
        traj, token = arg
        if traj not in self.parked or traj.park_token != token or not self.alive:
            return  # moved or taken since
        self.advance(now)
        self._unpark(traj)
        ctx = traj.prompt + traj.generated
        traj.generated += traj.out_tokens
        traj.next_call += 1
        traj.call_done_at = -1.0
        traj.resume_tokens = ctx + traj.out_tokens if traj.kv_lost else traj.out_tokens
        traj.reprefill += ctx if traj.kv_lost else 0.0
        traj.kv_lost = False
        self.waiting.appendleft(traj)
        self.admit(now)
        self.reschedule(now)

    def _unpark(self, traj: Traj) -> None:
        del self.parked[traj]
        self.parked_kv -= traj.prompt + traj.generated

    def take(self, traj: Traj) -> Traj:
        """Remove a running or parked request, keeping its progress (for interruption, moves, preemption). A
        parked one keeps its call's return time; its KV does not go with it."""
        if traj in self.parked:
            self._unpark(traj)
            traj.kv_lost = True
            return traj
        traj.generated = min(traj.target, self.context(traj) - traj.prompt)
        self._remove(traj)
        return traj

    def take_all(self, now: float) -> list[Traj]:
        """Every request, running (progress kept), parked, then waiting."""
        self.advance(now)
        out = [self.take(t) for t in list(self.running)] + [self.take(t) for t in list(self.parked)]
        out += list(self.waiting)
        self.waiting.clear()
        self._heap.clear()
        self.reschedule(now)
        return out

    def admit(self, now: float) -> None:
        """Continuous batching: start waiting requests while a sequence slot and KV room remain."""
        limit = 0.95 * self.kv_capacity
        fresh = again = 0.0
        while self.waiting and len(self.running) < self.max_seqs:
            traj = self.waiting[0]
            ctx = traj.prompt + traj.generated
            if self.running and self.kv_used + ctx > limit:
                break
            self.waiting.popleft()
            traj.offset = ctx - self.steps
            traj.finish_step = self.steps + (traj.stop - traj.generated)
            traj.replica = self
            self._admits += 1
            traj.admit_seq = self._admits
            self.offsets += traj.offset
            self.running[traj] = None
            heapq.heappush(self._heap, (traj.finish_step, traj.tid, traj))
            if traj.resume_tokens:  # back from a tool call: its output (and a lost context) only
                fresh += traj.resume_tokens
                traj.resume_tokens = 0.0
            elif traj.generated > 0:
                traj.reprefill += ctx
                again += ctx
            else:
                fresh += ctx
        if fresh or again:
            total = self.prefill_cost(fresh + again)
            self.stall(now, total * fresh / (fresh + again), "prefill")
            self.stall(now, total * again / (fresh + again), "reprefill")

    def add(self, trajs: list[Traj], now: float, front: bool = False) -> None:
        """Queue requests and start what fits; one still waiting for its tool call parks here until then."""
        self.advance(now)
        for t in trajs:
            if t.call_done_at >= 0:
                self._park(t, now)
        trajs = [t for t in trajs if t.call_done_at < 0]
        if front:
            self.waiting.extendleft(reversed(trajs))
        else:
            self.waiting.extend(trajs)
        self.admit(now)
        self.reschedule(now)
