"""Requests leaving and entering a replica (repack and recovery), with their tool turns: what the engine exports or
imports plus the state of a call in flight, and the progress the partial response pool keeps of each."""

from __future__ import annotations

import concurrent.futures as cf
from typing import Any

from laminar.rollout.inflight import InFlight

# How long an export waits for the tool calls of the requests it moves (off the decode loop). A call still running
# after that keeps its request here: a tool runs once per turn, and only recovery may run one again.
TOOL_EXPORT_WAIT_S = 1.0


def export_request(engine: Any, tools: Any, rid: str, with_kv: bool = False) -> tuple[Any, Any]:
    """A request out of this replica with its tool state (`TurnState`, or None without tools): a parked one goes
    with its pending call and, once the call is back, its result. Raises while its call still runs. `with_kv`:
    with its cached keys and values (a repack move to a replica of the same weights)."""
    tool = tools.export(rid) if tools is not None else None
    return engine.export_request(rid, with_kv=with_kv), tool


def import_request(engine: Any, tools: Any, exported: Any, tool: Any) -> None:
    """A moved or recovered request into this replica; one parked on a call resumes with the call's result when it
    came with it, else the call runs again here (counted in `tools.reruns`)."""
    rid = exported.request_id
    if exported.parked and (tools is None or tool is None or not tool.parked):
        raise ValueError(f"request {rid!r} is parked on a tool call but came without that call")
    engine.import_request(exported)
    if tools is not None and tool is not None:
        tools.import_(rid, tool)


def progress_update(engine: Any, tools: Any, rid: str, reported: int) -> tuple:
    """What the partial response pool gets of a request past its first `reported` tokens: the tokens and their
    log-probs, and with tools their loss mask and the tool state they end in."""
    tokens, logprobs = engine.progress(rid)
    if tools is None:
        return tokens[reported:], logprobs[reported:]
    tool = tools.state(rid)
    mask = engine.loss_mask(rid)[reported:]
    return tokens[reported:], logprobs[reported:], mask, tool.as_dict() if tool is not None else None


class Moves:
    """`RolloutReplica`'s side of a move, applied by the loop thread between two engine steps."""

    def export_requests(
        self, request_ids: list[str], wait_s: float = TOOL_EXPORT_WAIT_S, with_kv: bool = False
    ) -> list[tuple[Any, InFlight]]:
        """Remove these requests (those still here) with their tool state: a parked one goes with its pending
        call and, once the call is back, its result. Their running calls are waited for up to `wait_s`, on the
        caller's thread while the loop decodes on; a request whose call is still running after that stays."""
        if self.tools is not None:
            running = self.run_in_loop(lambda: self.tools.running(request_ids))
            cf.wait(running, timeout=wait_s)

        def export() -> list[tuple[Any, InFlight]]:
            out = []
            for rid in request_ids:
                if rid not in self.inflight or (self.tools is not None and self.tools.busy(rid)):
                    continue
                exported, tool = export_request(self.engine, self.tools, rid, with_kv)
                state = self.inflight.pop(rid)
                state.tool = tool
                out.append((exported, state))
            return out

        return self.run_in_loop(export)

    def import_requests(self, items: list[tuple[Any, InFlight]]) -> list[str]:
        """Accept moved or recovered trajectories of this replica's version (from their tokens so far, or from
        their prompt when they have none); returns the ids refused (version differs)."""

        def import_() -> list[str]:
            refused = []
            for exported, state in items:
                rid = state.group.traj_id(state.sample_idx)
                if state.version != self.engine.version:
                    refused.append(rid)
                    continue
                if rid in self.inflight:  # here already (a move a lost manager had made): taken
                    continue
                tool, state.tool = state.tool, None
                import_request(self.engine, self.tools, exported, tool)
                self.inflight[rid] = state
            return refused

        return self.run_in_loop(import_)
