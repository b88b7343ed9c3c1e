"""Tool turns inside a replica's decode loop: find a turn that ends in a tool call, park the request, run the
tool on a worker thread, and resume the request with the tool's output once it is back.

The decode loop never waits for a tool: a parked request is out of the engine's batch, the others keep decoding,
and the loop looks for finished calls between engine steps (`ToolTurns.poll`). The tool's output goes back as
context tokens (rendered by `render`, e.g. through the chat template's tool role), which the engine prefills
after the cached prefix and which are never trained on (their mask is 0).
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from laminar.tools.registry import ToolCall, ToolFn, parse_tool_call, run_tool_call
from laminar.tools.sandbox import SandboxLimits, ToolResult

CALL_ENDS = ("`", ">")  # a fenced block or a </tool_call> closes on one of these characters


@dataclass
class Turn:
    """One request's tool state: where its current model turn starts (in its output), how many calls it has
    made, and the call in flight."""

    start: int = 0
    calls: int = 0
    pending: cf.Future | None = None
    waited_s: float = 0.0  # time spent parked, all calls told
    parked_at: float = 0.0
    first_call_end: int | None = None  # output length when the first call closed (before any context)
    context: int = 0  # context tokens appended so far (outputs minus these are the sampled tokens)
    scripted_ids: list[int] | None = None  # a scripted call's output, given as tokens


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
    # a request's scripted calls (the benchmark's tool workload, `laminar.data.lengths`), or None
    script_of: Callable[[str], dict[str, Any] | None] | None = None
    script_token: int = 0  # the token a scripted call's output is made of
    turns: dict[str, Turn] = field(default_factory=dict)
    calls: int = 0
    errors: int = 0

    def __post_init__(self) -> None:
        self.pool = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="tool")

    # ---- the loop's two hooks ----------------------------------------------------------------------------
    def after_step(self, engine: Any, out: Any) -> None:
        """For each request that sampled a token this step: if its turn now ends in a tool call, park it and
        start the call."""
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
                latency = float(script["latency_s"][turn.calls])
                turn.scripted_ids = [self.script_token] * int(script["output_tokens"])
                self._park(engine, rid, turn, len(output), self.pool.submit(_scripted_call, latency))
                continue
            call = self._find_call(output[turn.start :], new)
            if call is not None:
                self._park(
                    engine,
                    rid,
                    turn,
                    len(output),
                    self.pool.submit(run_tool_call, call, self.tools, self.limits),
                )

    def _park(self, engine: Any, rid: str, turn: Turn, length: int, call: cf.Future) -> None:
        engine.park(rid)
        if turn.first_call_end is None:
            turn.first_call_end = length
        turn.calls += 1
        turn.parked_at = time.monotonic()
        turn.pending = call
        self.calls += 1

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
            result: ToolResult = fut.result()
            self.errors += not result.ok
            if turn.scripted_ids is not None:
                ids, turn.scripted_ids = turn.scripted_ids, None
            else:
                ids = self.render(result.text)[: self.max_output_tokens]
            fin = engine.resume(rid, ids)
            if fin is not None:
                ended.append(fin)
                self.turns.pop(rid, None)
            else:
                turn.context += len(ids)
                turn.start = len(engine.progress(rid)[0])
        return ended

    # ---- bookkeeping ---------------------------------------------------------------------------------------
    def busy(self, rid: str) -> bool:
        """A call of this request is running: it cannot be moved (its result comes back here)."""
        turn = self.turns.get(rid)
        return turn is not None and turn.pending is not None

    def has_pending(self) -> bool:
        return any(t.pending is not None for t in self.turns.values())

    def forget(self, rid: str) -> Turn | None:
        """The request finished, moved or was dropped; its turn state goes with it."""
        return self.turns.pop(rid, None)

    def first_context(self, rid: str) -> int | None:
        """Where the request's first tool output starts in its output (None before its first call): progress
        reported past it could not be recovered exactly (the partial pool keeps model tokens only, so a
        recovered trajectory restarts from its first call and runs the tool again)."""
        turn = self.turns.get(rid)
        return None if turn is None else turn.first_call_end

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


def _scripted_call(latency_s: float) -> ToolResult:
    """A benchmark's tool: it takes its scripted time and returns (its output is given as tokens)."""
    time.sleep(latency_s)
    return ToolResult(text="", ok=True, reason="ok", seconds=latency_s, truncated=False)
