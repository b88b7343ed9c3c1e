"""The replica's tool-turn driver over a real engine: a turn that ends in a call parks, the tool runs on a worker
thread while the other requests decode, and the request resumes with the tool's output as context."""

import time
from dataclasses import replace

import pytest

from laminar.tools.registry import ToolCall
from laminar.tools.sandbox import ToolResult
from laminar.tools.turns import ToolTurns

from .helpers import drain, engine_for, hf_model
from .test_tool_turns import PARAMS, PROMPT, TOOL, uninterrupted


@pytest.fixture(scope="module")
def model():
    return hf_model("qwen2")


def slow_tool(arguments: str, limits) -> ToolResult:  # noqa: ANN001 - SandboxLimits
    time.sleep(0.2)  # the other request keeps decoding meanwhile
    return ToolResult(text=f"ran {arguments}", ok=True, reason="ok", seconds=0.2, truncated=False)


def play(engine, turns, on_step=lambda out: None) -> dict:
    """The replica's loop: step, park turns that end in a call, resume those whose call came back (waiting a
    little only when nothing decoded); the finished requests by id."""
    done = {}
    while engine.has_unfinished():
        out = engine.step()
        done.update({f.request_id: f for f in out.finished})
        on_step(out)
        turns.after_step(engine, out)
        done.update({f.request_id: f for f in turns.poll(engine, wait_s=0.0 if out.new_tokens else 0.05)})
    turns.shutdown()
    return done


@pytest.mark.parametrize("pipeline", [False, True], ids=["step-by-step", "pipelined"])
def test_a_call_parks_runs_off_the_loop_and_resumes_exactly(model, pipeline):
    """Pipelined too (the default on CUDA): the step queued while the caller parks the request drops its row."""
    ref = engine_for(model)
    ref.add_request("r", PROMPT, PARAMS)
    ref.add_request("other", [7, 8, 9], PARAMS)
    alone = drain(ref)
    marker = alone["r"].output_token_ids[4]
    stop = alone["r"].output_token_ids.index(marker) + 1  # the first turn ends at the marker's first use

    rendered = []
    turns = ToolTurns(
        tools={"slow": slow_tool},
        decode=lambda ids: " ".join(map(str, ids)),
        render=lambda text: rendered.append(text) or list(TOOL),
        max_turns=1,
        detect=lambda ids: ToolCall("slow", str(len(ids)), "") if ids and ids[-1] == marker else None,
    )
    engine = engine_for(model, pipeline=pipeline)
    engine.add_request("r", PROMPT, PARAMS)
    engine.add_request("other", [7, 8, 9], PARAMS)
    decoded_while_parked = []
    done = play(
        engine,
        turns,
        lambda out: decoded_while_parked.append(turns.has_pending() and "other" in out.new_tokens),
    )

    assert rendered == [f"ran {stop}"] and turns.calls == 1 and turns.errors == 0
    assert any(decoded_while_parked)  # the loop never waited for the tool while there was work
    assert done["other"].output_token_ids == alone["other"].output_token_ids
    turn1 = alone["r"].output_token_ids[:stop]
    want = uninterrupted(model, turn1)
    got = done["r"]
    assert got.output_token_ids == turn1 + TOOL + want.output_token_ids
    assert got.loss_mask == [1] * stop + [0] * len(TOOL) + [1] * len(want.output_token_ids)
    assert turns.turns["r"].waited_s >= 0.2


def test_max_turns_bounds_the_calls(model):
    turns = ToolTurns(
        tools={"slow": slow_tool},
        decode=str,
        render=lambda text: [3],
        max_turns=2,
        detect=lambda ids: ToolCall("slow", "", "") if ids else None,  # every token closes a call
    )
    engine = engine_for(model)
    engine.add_request("r", PROMPT, replace(PARAMS, max_new_tokens=12))
    done = play(engine, turns)
    assert turns.calls == 2
    assert done["r"].loss_mask.count(0) == 2


def test_a_call_runs_only_after_its_park_is_recorded(model):
    """The replica's write-ahead: `after_step(start=False)` parks and marks the request changed, the replica
    records that with the partial response pool, and only `start_parked` runs the call. So a call never runs
    unknown to the pool, and a recovery counts every call it runs again."""
    recorded: set[str] = set()
    seen_before_running = []

    def tool(arguments: str, limits) -> ToolResult:  # noqa: ANN001 - SandboxLimits
        seen_before_running.append(arguments in recorded)
        return ToolResult(text="ok", ok=True, reason="ok", seconds=0.0, truncated=False)

    turns = ToolTurns(
        tools={"t": tool},
        decode=str,
        render=lambda text: [3],
        max_turns=3,
        detect=lambda ids: ToolCall("t", str(len(ids)), "") if len(ids) % 2 == 0 else None,
    )
    engine = engine_for(model)
    engine.add_request("r", PROMPT, replace(PARAMS, max_new_tokens=12))
    while engine.has_unfinished():
        out = engine.step()
        turns.after_step(engine, out, start=False)
        for rid in turns.changed():  # what the replica reports (and waits for) before starting the calls
            state = turns.state(rid)
            assert state.parked and state.result is None and not turns.busy(rid)
            recorded.add(state.call.arguments)
        turns.start_parked()
        turns.poll(engine, wait_s=0.0 if out.new_tokens else 0.05)
        turns.changed()  # the resumed ones, reported without waiting
    turns.shutdown()
    assert turns.calls == 3 and seen_before_running == [True, True, True]


@pytest.mark.parametrize("pipeline", [False, True], ids=["step-by-step", "pipelined"])
def test_a_scripted_call_workload_parks_where_the_script_says(model, pipeline):
    """The benchmark's tool workload: calls after the scripted counts of sampled tokens, each returning its
    scripted number of context tokens."""
    script = {"calls_at": [3, 7], "latency_s": [0.05, 0.01], "output_tokens": 4}
    turns = ToolTurns(
        tools={}, decode=str, render=lambda text: [], script_of=lambda rid: script, script_token=9
    )
    engine = engine_for(model, pipeline=pipeline)
    n = 12
    engine.add_request("r", PROMPT, replace(PARAMS, max_new_tokens=n + 2 * 4))
    got = play(engine, turns)["r"]
    assert got.loss_mask == [1] * 3 + [0] * 4 + [1] * 4 + [0] * 4 + [1] * 5
    assert [t for t, m in zip(got.output_token_ids, got.loss_mask) if not m] == [9] * 8
    assert turns.calls == 2 and turns.waited_s() >= 0.06


def test_calls_that_wait_for_a_tool_worker_count_their_wait(model):
    """Two requests call at the same token with one worker: the second call waits for the first, and the wait is
    counted (`queued_s`, the replica's `tool_queued_s`: a pool too small for the batch shows there)."""
    # a call long enough that a loaded machine's thread wake-ups (tens of ms) cannot blur one worker and two
    script = {"calls_at": [3], "latency_s": [1.0], "output_tokens": 2}
    waits = {}
    for workers in (1, 2):
        turns = ToolTurns(
            tools={}, decode=str, render=lambda text: [], script_of=lambda rid: script, workers=workers
        )
        engine = engine_for(model)
        for rid in ("a", "b"):
            engine.add_request(rid, PROMPT, replace(PARAMS, max_new_tokens=8))
        assert set(play(engine, turns)) == {"a", "b"}
        waits[workers] = turns.queued_s
    assert waits[1] >= 0.9 and waits[2] < 0.5
