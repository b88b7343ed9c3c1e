"""A parked trajectory (waiting for its tool) moves like a running one: between two real engines with their tool
drivers, by export/import (repack) and through the partial response pool (recovery). It ends with exactly the
tokens, log-probs and loss mask of the same trajectory never moved, and its tool runs once per turn; only a call
whose result was lost with its replica runs again, and that is counted."""

from __future__ import annotations

import concurrent.futures as cf
import json
import pickle
import threading

import pytest

from laminar.data.partial_pool import PartialPool
from laminar.data.records import PromptGroup
from laminar.engine import SamplingParams
from laminar.manager.recovery import GroupWork, engine_items, lost_calls, plan_recovery
from laminar.rollout.inflight import sample_seed
from laminar.rollout.moves import export_request, import_request, progress_update
from laminar.tools.registry import ToolCall
from laminar.tools.sandbox import ToolResult
from laminar.tools.turns import ToolTurns

from .helpers import engine_for, hf_model

RUN_SEED = 5
SAMPLING = {"temperature": 1.0, "max_new_tokens": 30, "ignore_eos": True}
GROUP = PromptGroup(7, list(range(30, 50)), n=1)
RID = GROUP.traj_id(0)
TURN_TOKENS = 5  # every model turn closes a call after this many sampled tokens


@pytest.fixture(scope="module")
def model():
    return hf_model("qwen2")


class CountingTool:
    """A tool that records every invocation; its calls from number `hold` on (counting from 0) block until
    released, so a move or a replica's death can find one running."""

    def __init__(self, hold: int | None = None) -> None:
        self.calls: list[str] = []
        self.hold = hold
        self.release = threading.Event()

    def __call__(self, arguments: str, limits) -> ToolResult:  # noqa: ANN001 - SandboxLimits
        self.calls.append(arguments)
        if self.hold is not None and len(self.calls) > self.hold:
            assert self.release.wait(30), "the test never released the tool"
        return ToolResult(text=f"ran {arguments}", ok=True, reason="ok", seconds=0.0, truncated=False)


def driver(tool: CountingTool) -> ToolTurns:
    """Two tool turns at most; a call's output renders to tokens that depend on its text (a wrong or missing
    result changes the trajectory)."""
    return ToolTurns(
        tools={"count": tool},
        decode=str,
        render=lambda text: [40 + len(text), 41, 42, 43 + len(text) % 3],
        max_turns=2,
        detect=lambda ids: (
            ToolCall("count", f"turn of {len(ids)} at {ids[0]}", "") if len(ids) >= TURN_TOKENS else None
        ),
    )


def start(model, **engine_kw):
    engine = engine_for(model, **engine_kw)
    engine.add_request(RID, GROUP.prompt_ids, SamplingParams(seed=sample_seed(RUN_SEED, RID), **SAMPLING))
    return engine


def play(engine, turns, stop=lambda: False, pool=None) -> dict:
    """The replica's loop (step, park, resume) until `stop()` or every request finished; with `pool`, progress goes
    there as the replica sends it (at every park and resume)."""
    done, reported = {}, 0
    while engine.has_unfinished() and not stop():
        out = engine.step()
        done.update({f.request_id: f for f in out.finished})
        turns.after_step(engine, out)
        done.update({f.request_id: f for f in turns.poll(engine, wait_s=0.0 if out.new_tokens else 0.05)})
        if pool is not None and turns.changed() and RID not in done:
            update = progress_update(engine, turns, RID, reported)
            pool.progress({RID: update})
            reported += len(update[0])
    return done


@pytest.fixture(scope="module")
def never_moved(model):
    tool = CountingTool()
    turns = driver(tool)
    fin = play(start(model), turns)[RID]
    turns.shutdown()
    assert fin.loss_mask.count(0) == 8 and len(tool.calls) == 2  # two turns, each closed by a call
    return fin, tool.calls


def same(got, want) -> None:
    assert got.output_token_ids == want.output_token_ids
    assert got.loss_mask == want.loss_mask
    assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    context = [lp for lp, m in zip(got.logprobs, got.loss_mask) if not m]
    assert context == [0.0] * len(context)  # a tool's output is context: no log-prob, never trained on


def move(src, src_turns, dst, dst_turns) -> None:
    exported, tool = export_request(src, src_turns, RID)
    exported, tool = pickle.loads(pickle.dumps((exported, tool)))  # as it crosses to another process
    import_request(dst, dst_turns, exported, tool)


def test_a_trajectory_moved_mid_call_waits_for_its_call_and_resumes_with_its_result(model, never_moved):
    want, want_calls = never_moved
    tool = CountingTool(hold=0)
    src, src_turns = start(model), driver(tool)
    play(src, src_turns, stop=lambda: src_turns.busy(RID))  # parked on its first call, which runs
    with pytest.raises(RuntimeError, match="still running"):
        export_request(src, src_turns, RID)  # its result would come back to the wrong replica
    assert src.has_unfinished()  # nothing left: it stays where its call runs
    running = src_turns.running([RID])
    tool.release.set()
    cf.wait(running, timeout=30)  # the mover waits for it (the replica: off its decode loop)
    dst, dst_turns = engine_for(model), driver(tool)
    move(src, src_turns, dst, dst_turns)
    assert dst.stats().parked == 1 and not src.has_unfinished()
    got = play(dst, dst_turns)[RID]
    same(got, want)
    assert tool.calls == want_calls and dst_turns.reruns == 0  # once per turn, across both replicas


@pytest.mark.parametrize("pipeline", [False, True], ids=["step-by-step", "pipelined"])
def test_a_trajectory_moved_after_its_call_returned_and_one_moved_mid_turn_end_as_never_moved(
    model, never_moved, pipeline
):
    """Pipelined too: each move leaves a queued decode row behind, dropped when its step is collected."""
    want, want_calls = never_moved
    tool = CountingTool(hold=0)
    a, a_turns = start(model, pipeline=pipeline), driver(tool)
    play(a, a_turns, stop=lambda: a_turns.busy(RID))
    running = a_turns.running([RID])
    tool.release.set()
    cf.wait(running, timeout=30)  # back, not yet given to the request
    assert a.stats().parked == 1 and not a_turns.busy(RID)
    b, b_turns = engine_for(model, pipeline=pipeline), driver(tool)
    move(a, a_turns, b, b_turns)
    # on b, a few tokens into its second turn, it moves back to a running one: its turn count goes with it
    play(b, b_turns, stop=lambda: b.stats().parked == 0 and len(b.progress(RID)[0]) > TURN_TOKENS + 6)
    assert b_turns.turns[RID].calls == 1
    move(b, b_turns, a, a_turns)
    got = play(a, a_turns)[RID]
    same(got, want)
    assert tool.calls == want_calls and a_turns.reruns == b_turns.reruns == 0
    for t in (a_turns, b_turns):
        t.shutdown()


def recover(model, pool: PartialPool, tool: CountingTool):
    """The partial pool's record placed on a fresh replica as the supervisor places a dead replica's work."""
    entry = pool.get(RID)
    [placement] = plan_recovery([GroupWork(GROUP, [entry], versions={0})], {1: 0})
    items = engine_items(placement, SAMPLING, RUN_SEED, 0.0)
    engine, turns = engine_for(model), driver(tool)
    [(exported, state)] = items
    import_request(engine, turns, exported, state.tool)
    return play(engine, turns)[RID], turns, lost_calls(items)


def test_a_recovered_trajectory_continues_after_its_last_completed_turn(model, never_moved):
    want, want_calls = never_moved
    tool = CountingTool()
    pool = PartialPool()
    pool.start(GROUP, replica=0, version=0)
    src, src_turns = start(model), driver(tool)
    # its replica dies a few tokens into the second turn, after the first call came back and was given
    play(src, src_turns, stop=lambda: len(src.progress(RID)[0]) > TURN_TOKENS + 6, pool=pool)
    src_turns.shutdown()
    pool.restore(json.loads(json.dumps(pool.snapshot())))  # the pool's record survives a checkpoint too
    entry = pool.get(RID)
    assert entry.loss_mask.count(0) == 4 and entry.tool["calls"] == 1 and entry.tool["call"] is None
    got, turns, lost = recover(model, pool, tool)
    same(got, want)
    assert tool.calls == want_calls and lost == turns.reruns == 0  # the first call did not run again


def test_a_call_lost_with_its_replica_runs_again_and_is_counted(model, never_moved):
    want, want_calls = never_moved
    tool = CountingTool(hold=1)
    pool = PartialPool()
    pool.start(GROUP, replica=0, version=0)
    src, src_turns = start(model), driver(tool)
    # its replica dies while the second call runs: the pool knows the call, not its result
    play(src, src_turns, stop=lambda: len(tool.calls) == 2, pool=pool)
    entry = pool.get(RID)
    assert entry.tool["calls"] == 2 and entry.tool["call"] is not None and entry.tool["result"] is None
    tool.release.set()
    src_turns.shutdown()
    got, turns, lost = recover(model, pool, tool)
    same(got, want)
    assert lost == turns.reruns == 1
    assert tool.calls == [
        want_calls[0],
        want_calls[1],
        want_calls[1],
    ]  # that turn's call, twice; the first once
