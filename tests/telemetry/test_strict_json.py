"""The run's records are strict JSON, and the console shows each kind of alert at most once per interval."""

import io
import json
import math

import numpy as np
import pytest

from laminar.telemetry.console import Console, one_line
from laminar.telemetry.recorder import Recorder, dumps, write_json
from laminar.telemetry.summary import errors, summarize


def strict_load(text: str):
    def refuse(token):
        raise ValueError(f"non-standard JSON constant {token}")

    return json.loads(text, parse_constant=refuse)


def test_nonfinite_numbers_are_written_as_null_and_every_line_parses_strictly(tmp_path):
    rec = Recorder(tmp_path, t0=0.0)
    rec.log(
        "step",
        t=1.0,
        step=1,
        loss=math.nan,
        grad_norm=np.float64("inf"),
        staleness=[0, 1],
        nonfinite=True,
        reward_mean=0.0,
        tokens=10,
    )
    rec.log("nested", t=2.0, stats={"a": [1.0, -math.inf], "b": (math.nan,)})
    rec.close()
    lines = [strict_load(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["loss"] is None and lines[0]["grad_norm"] is None and lines[0]["staleness"] == [0, 1]
    assert lines[1]["stats"] == {"a": [1.0, None], "b": [None]}
    assert rec.records[0]["loss"] is None  # what the summary reads is the same as the file
    summary = summarize(rec.records, schedule="laminar", wall_s=3.0, warmup_steps=0, trajectories={})
    assert summary["nonfinite_steps"] == 1
    strict_load(write_json(tmp_path / "summary.json", summary).read_text())


def test_the_encoder_refuses_what_it_cannot_write_strictly():
    assert dumps({"x": math.nan}) == '{"x": null}'
    with pytest.raises(TypeError):
        dumps({"x": np.float32(1.0)})  # not a float: a regression here raises instead of writing garbage
    with pytest.raises(ValueError, match="Out of range float"):
        json.dumps(math.nan, allow_nan=False)  # the guard under `dumps`


def test_summary_counts_reward_errors_by_kind_replica_errors_and_skipped_steps():
    records = [
        {"kind": "reward_error", "error_kind": "raised"},
        {"kind": "reward_error", "error_kind": "not_finite"},
        {"kind": "reward_error", "error_kind": "raised"},
        {"kind": "replica_error", "error": "ValueError: x"},
        {"kind": "step", "nonfinite": False},
        {"kind": "step", "nonfinite": True},
    ]
    assert errors(records) == {
        "reward_errors": 3,
        "reward_errors_by_kind": {"not_finite": 1, "raised": 2},
        "replica_errors": 1,
        "nonfinite_steps": 1,
    }


def test_console_rate_limits_each_kind_and_says_how_many_it_held_back():
    now = [0.0]
    out = io.StringIO()
    console = Console(every_s=5.0, stream=out, clock=lambda: now[0])
    error = {"kind": "reward_error", "error_kind": "raised", "row": 3, "traj_id": "1:0", "error": "KeyError"}
    assert "row 3" in console.show(error)
    assert console.show({**error, "row": 4}) is None and console.show({**error, "row": 5}) is None
    failure = {
        "kind": "replica_error",
        "replica": 2,
        "error": "ValueError: bad",
        "traceback": "Traceback\n  x",
    }
    assert "Traceback" in console.show(
        failure
    )  # another kind is not held back; the first shows its traceback
    assert console.show({"kind": "step", "nonfinite": False}) is None
    now[0] = 6.0
    assert "and 2 more like it" in console.show({**error, "row": 6})
    assert "Traceback" not in console.show(failure)
    assert len(out.getvalue().splitlines()) == 6  # four alerts, one with a two-line traceback
    console.show({**error, "row": 7})
    console.show({**error, "row": 8})
    assert console.flush() == ["laminar: 2 more reward errors not shown (see metrics.jsonl)"]
    assert console.flush() == []


def test_one_line_unwraps_to_the_cause_and_keeps_its_first_line():
    class Wrapper(RuntimeError):
        def __init__(self, cause):
            super().__init__("Traceback (most recent call last):\n  ...\nlong")
            self.cause = cause

    assert one_line(Wrapper(ValueError("dataset x has no rows\nmore"))) == "ValueError: dataset x has no rows"
    assert one_line(KeyError()) == "KeyError"


def test_every_start_up_phase_is_shown_with_its_time_and_a_short_filtered_step_is_an_alert():
    out = io.StringIO()
    console = Console(every_s=5.0, stream=out, clock=lambda: 0.0)
    for t, what in [
        (0.0, "starting Ray"),
        (0.4, "starting the trainer"),
        (2.25, "starting 3 rollout replicas"),
    ]:
        console.show({"kind": "phase", "t": t, "what": what})  # never rate-limited: each is a new phase
    assert out.getvalue().splitlines() == [
        "laminar: [   0.0s] starting Ray",
        "laminar: [   0.4s] starting the trainer",
        "laminar: [   2.2s] starting 3 rollout replicas",
    ]
    short = {
        "kind": "filter_short",
        "step": 3,
        "kept": 1,
        "wanted": 4,
        "taken": 16,
        "why": "trainer.filter_take_limit",
    }
    line = console.show(short)
    assert (
        "step 3: only 1 of 4 groups had unequal rewards after taking 16 (trainer.filter_take_limit)" in line
    )
    assert line.endswith("training on those")


def test_the_summary_gives_a_tool_calls_wait_for_a_worker():
    step = {"kind": "step", "t": 1.0, "tokens": 10, "reward_mean": 0.0, "staleness": [0]}
    steps = [{**step, "t": float(t), "tool_calls_mean": 1.0, "tool_call_frac": 1.0} for t in (1, 2)]
    replica = {"kind": "replica", "tokens_generated": 5, "running": 0, "waiting": 0}
    records = steps + [
        {**replica, "t": 1.0, "replica": 0, "tool_calls": 2, "tool_queued_s": 0.5},
        {**replica, "t": 2.0, "replica": 0, "tool_calls": 6, "tool_queued_s": 1.5},  # the last counts
        {**replica, "t": 2.0, "replica": 1, "tool_calls": 4, "tool_queued_s": 0.5},
    ]
    summary = summarize(records, schedule="laminar", wall_s=3.0, warmup_steps=0, trajectories={})
    assert summary["tool_calls"]["queued_s_per_call"] == pytest.approx(2.0 / 10)
