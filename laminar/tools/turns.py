"""Tool turns inside a replica's decode loop: find a turn that ends in a tool call, park the request, run the
tool on a worker thread, and resume the request with the tool's output once it is back.

The decode loop never waits for a tool: a parked request is out of the engine's batch, the others keep decoding,
and the loop looks for finished calls between engine steps (`ToolTurns.poll`). The tool's output goes back as
context tokens (rendered by `render`, e.g. through the chat template's tool role), which the engine prefills
after the cached prefix and which are never trained on (their mask is 0).

A request's tool state travels with its tokens (`TurnState`: repack, export/import, the partial response pool): the
call it is parked on and, once that call has come back, its result, so the receiving replica resumes it with the
result instead of running the call again. Only a call whose result was lost (its replica died while it ran) runs
again; `ToolTurns.reruns` counts those. The replica records a park with the pool before the call starts
(`after_step(start=False)`, then `start_parked`), so a call that ran is never unknown to a recovery: every call
that runs twice is counted.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from laminar.tools.registry import ToolCall, ToolFn, parse_tool_call, run_tool_call
from laminar.tools.sandbox import SandboxLimits, ToolResult

CALL_ENDS = ("`", ">")  # a fenced block or a </tool_call> closes on one of these characters


@dataclass
class TurnState:
    """A request's tool state, plain values only: where its current model turn starts (in its output), how many
    calls it has made, how many context tokens it was given, and the call it is parked on (`call`, or a scripted
    call's `scripted_ids` and `latency_s`) with that call's `result` once it has come back."""

    start: int = 0
    calls: int = 0
    context: int = 0  # context tokens appended so far (outputs minus these are the sampled tokens)
    waited_s: float = 0.0  # time spent parked, all calls told
    call: ToolCall | None = None
    scripted_ids: list[int] | None = None  # a scripted call's output, given as tokens
    latency_s: float = 0.0  # a scripted call's
    result: ToolResult | None = None

    @property
    def parked(self) -> bool:
        """It waits for a call (its result may be known already)."""
        return self.call is not None or self.scripted_ids is not None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the partial response pool keeps it, and checkpoints it)."""
        return asdict(self)

    @classmethod
    def of(cls, d: dict[str, Any]) -> TurnState:
        d = dict(d)
        if d.get("call") is not None:
            d["call"] = ToolCall(**d["call"])
        if d.get("result") is not None:
            d["result"] = ToolResult(**d["result"])
        return cls(**d)


@dataclass
class Turn(TurnState):
    """A request's tool state on this replica: its state plus the call in flight."""

    pending: cf.Future | None = None
    parked_at: float = 0.0
    started_at: float = 0.0  # when the call in flight got a tool worker (0: not yet)

    def state(self) -> TurnState:
        """What travels: the state, with the call's result if it is back (not yet given to the request)."""
        plain = {f.name: getattr(self, f.name) for f in fields(TurnState)}
        if self.pending is not None and self.pending.done():
            plain["result"] = self.pending.result()
        return TurnState(**plain)


@dataclass
class ToolTurns:
    """`detect(turn_ids) -> ToolCall | None` finds a call that closes the current turn (by default the text
    through `decode`, read by `parse_tool_call`); `render(text) -> ids` gives the context tokens of a tool's
    output. At most `max_turns` calls a trajectory; a tool's output is cut to `max_output_tokens`."""

    tools: Mapping[str, ToolFn]
    decode: Callable[[list[int]], str]
    render: Callable[[str], list[int]]
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    max_turns: int = 4
    max_output_tokens: int = 256
    workers: int = 4
    detect: Callable[[list[int]], ToolCall | None] | None = None
    # a request's scripted calls (the benchmark's tool workload, `laminar.tasks.lengths`), or None
    script_of: Callable[[str], dict[str, Any] | None] | None = None
    script_token: int = 0  # the token a scripted call's output is made of
    turns: dict[str, Turn] = field(default_factory=dict)
    calls: int = 0
    errors: int = 0
    reruns: int = 0  # calls run again here because their result was lost with another replica
    queued_s: float = 0.0  # time calls waited for a free tool worker, all calls told
    _changed: set[str] = field(default_factory=set)
    # parked by `after_step(start=False)`, their calls not started yet
    _unstarted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pool = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="tool")

    # ---- the loop's two hooks ----------------------------------------------------------------------------
    def after_step(self, engine: Any, out: Any, start: bool = True) -> None:
        """For each request that sampled a token this step: if its turn now ends in a tool call, park it and
        start the call. `start=False`: park only; `start_parked` starts the calls once their parks are recorded
        (the replica's write-ahead: the partial response pool learns of a call before it runs)."""
        finished = {f.request_id for f in out.finished}
        for rid, new in out.new_tokens.items():
            if rid in finished:
                continue
            turn = self.turns.setdefault(rid, Turn())
            if turn.calls >= self.max_turns:
                continue
            output = engine.progress(rid)[0]
            script = self.script_of(rid) if self.script_of is not None else None
            if script is not None:
                calls_at = script["calls_at"]
                if turn.calls >= len(calls_at) or len(output) - turn.context < calls_at[turn.calls]:
                    continue
                turn.latency_s = float(script["latency_s"][turn.calls])
                turn.scripted_ids = [self.script_token] * int(script["output_tokens"])
                self._park(engine, rid, turn, start)
                continue
            turn.call = self._find_call(output[turn.start :], new)
            if turn.call is not None:
                self._park(engine, rid, turn, start)

    def _park(self, engine: Any, rid: str, turn: Turn, start: bool) -> None:
        engine.park(rid)
        turn.calls += 1
        if start:
            self._run(rid, turn)
        else:
            self._unstarted.append(rid)
            self._changed.add(rid)

    def start_parked(self) -> None:
        """Start the calls that `after_step(start=False)` parked."""
        for rid in self._unstarted:
            turn = self.turns.get(rid)
            if turn is not None and turn.parked and turn.pending is None:
                self._run(rid, turn)
                self._changed.discard(rid)  # its park is reported already
        self._unstarted.clear()

    def _run(self, rid: str, turn: Turn) -> None:
        """Start the call the request is parked on."""
        turn.parked_at, turn.started_at = time.monotonic(), 0.0
        if turn.scripted_ids is not None:
            turn.pending = self.pool.submit(_on_worker, turn, _scripted_call, turn.latency_s)
        else:
            turn.pending = self.pool.submit(
                _on_worker, turn, run_tool_call, turn.call, self.tools, self.limits
            )
        self.calls += 1
        self._changed.add(rid)

    def poll(self, engine: Any, wait_s: float = 0.0) -> list[Any]:
        """Resume every request whose tool call has come back (waiting up to `wait_s` for one when nothing else
        can run); returns the requests that ended instead (their context no longer fits: reason "length")."""
        pending = {t.pending: rid for rid, t in self.turns.items() if t.pending is not None}
        if not pending:
            return []
        done, _ = cf.wait(pending, timeout=wait_s, return_when=cf.FIRST_COMPLETED)
        ended = []
        for fut in done:
            rid = pending[fut]
            turn = self.turns[rid]
            turn.pending = None
            turn.waited_s += time.monotonic() - turn.parked_at
            if turn.started_at:
                self.queued_s += max(0.0, turn.started_at - turn.parked_at)
            result: ToolResult = fut.result()
            self.errors += not result.ok
            if turn.scripted_ids is not None:
                ids = turn.scripted_ids
            else:
                ids = self.render(result.text)[: self.max_output_tokens]
            turn.call, turn.scripted_ids, turn.result = None, None, None
            fin = engine.resume(rid, ids)
            if fin is not None:
                ended.append(fin)
                self.turns.pop(rid, None)
            else:
                turn.context += len(ids)
                turn.start = len(engine.progress(rid)[0])
                self._changed.add(rid)
        return ended

    # ---- moving a request ---------------------------------------------------------------------------------
    def busy(self, rid: str) -> bool:
        """A call of this request is still running: it cannot be moved yet (its result comes back here)."""
        turn = self.turns.get(rid)
        return turn is not None and turn.pending is not None and not turn.pending.done()

    def running(self, rids: Iterable[str]) -> list[cf.Future]:
        """The calls of these requests still running (a mover waits on them, off the decode loop)."""
        return [t.pending for r in rids if (t := self.turns.get(r)) is not None and self.busy(r)]

    def state(self, rid: str) -> TurnState | None:
        """The request's tool state now (None before it sampled a token here)."""
        turn = self.turns.get(rid)
        return None if turn is None else turn.state()

    def export(self, rid: str) -> TurnState | None:
        """Hand the request's tool state over (its engine request is exported beside it). A call still running
        cannot go: its result would come back to a replica that no longer holds the request."""
        if self.busy(rid):
            raise RuntimeError(f"request {rid!r}: its tool call is still running; wait for it before export")
        turn = self.turns.pop(rid, None)
        self._changed.discard(rid)
        return None if turn is None else turn.state()

    def import_(self, rid: str, state: TurnState) -> None:
        """Take over a request's tool state (its engine request is imported beside it, parked if it waits for a
        call). A known result resumes it at the next `poll`; a call whose result was lost runs again here,
        counted in `reruns`."""
        turn = Turn(**{f.name: getattr(state, f.name) for f in fields(TurnState)})
        self.turns[rid] = turn
        if not turn.parked:
            return
        if turn.result is not None:
            turn.pending = cf.Future()
            turn.pending.set_result(turn.result)
            turn.parked_at = time.monotonic()
        else:
            self.reruns += 1
            self._run(rid, turn)

    # ---- bookkeeping ---------------------------------------------------------------------------------------
    def has_pending(self) -> bool:
        return any(t.pending is not None for t in self.turns.values())

    def forget(self, rid: str) -> Turn | None:
        """The request finished, moved or was dropped; its turn state goes with it."""
        self._changed.discard(rid)
        return self.turns.pop(rid, None)

    def changed(self) -> set[str]:
        """Requests that parked on a call or resumed from one since the last ask (the replica reports them to the
        partial response pool at once, so a recovery knows every call made and every result given)."""
        out, self._changed = self._changed, set()
        return out

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def waited_s(self) -> float:
        return sum(t.waited_s for t in self.turns.values())

    def _find_call(self, turn_ids: list[int], new: list[int]) -> ToolCall | None:
        if self.detect is not None:
            return self.detect(turn_ids)
        if not any(c in self.decode(new) for c in CALL_ENDS):  # cheap: most tokens close nothing
            return None
        return parse_tool_call(self.decode(turn_ids))


def _on_worker(turn: Turn, fn: Callable[..., ToolResult], *args: Any) -> ToolResult:
    """Runs on a tool worker: notes when the call got one (the time before is its wait in the queue)."""
    turn.started_at = time.monotonic()
    return fn(*args)


def _scripted_call(latency_s: float) -> ToolResult:
    """A benchmark's tool: it takes its scripted time and returns (its output is given as tokens)."""
    time.sleep(latency_s)
    return ToolResult(text="", ok=True, reason="ok", seconds=latency_s, truncated=False)
