"""`rollout.speculation=auto`'s gate (`gate.py`): verify where the verify path's measured time per emitted token
is lower, plain otherwise, exploring the other now and then; fed measured times through its clock (no real
timing: deterministic)."""

from __future__ import annotations

import pytest

from laminar.engine.gate import GAP_MAX, Gate, bucket_of, expected_tokens


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(gate: Gate, steps: int, batch: int, predicted: float, plain: tuple, verify: tuple) -> list[str]:
    """`steps` decode steps of `batch` requests as the engine runs them: each takes the gate's choice, a plain
    step costing `plain` = (seconds, tokens emitted), a verify step `verify`. The choices, in order."""
    choices = []
    for _ in range(steps):
        choice = gate.choose(batch, predicted)
        verified = choice in ("verify", "explore_verify")
        gate.commit(batch, choice, verified)
        seconds, tokens = verify if verified else plain
        gate.clock.now += seconds
        gate.ended(batch, "verify" if verified else "plain", tokens)
        choices.append(choice)
    return choices


def gate() -> Gate:
    return Gate(cost_ratio=2.0, clock=Clock())


def test_expected_tokens_and_buckets():
    assert expected_tokens(0.5, 8) == pytest.approx(2.0, abs=0.01)
    assert expected_tokens(0.0, 8) == 1.0 and expected_tokens(1.0, 8) == 9.0
    assert [bucket_of(b) for b in (1, 2, 3, 4, 7, 8, 64)] == [1, 2, 2, 4, 4, 8, 64]


def test_prediction_before_measurements():
    g = gate()
    assert g.choose(4, 3.0) == "verify"  # 3 tokens a verify step against a cost of 2 plain steps
    assert g.choose(4, 1.5) == "plain"
    assert g.steps == dict.fromkeys(g.steps, 0)  # choosing changes nothing


def test_verify_where_measured_faster_though_predicted_slower():
    """Predicted 1.5 tokens a request (under the cost ratio): plain first; exploring, verify is measured at
    4 tokens a request for 1.5 plain steps' time, and becomes the choice; plain is still explored now and then."""
    g = gate()
    choices = drive(g, 300, 4, 1.5, plain=(1.0, 4), verify=(1.5, 16))
    assert choices[0] == "plain" and "explore_verify" in choices[:20]
    late = choices[100:]
    assert late.count("verify") > 0.9 * len(late), late
    assert "explore_plain" in late
    b = g.bucket(4)
    assert b.verify < b.plain
    assert g.steps["verify"] + g.steps["explore_verify"] > 0.9 * 300
    assert g.ms_per_token() == {"4-7": {"plain": 250.0, "verify": 93.75}}


def test_plain_where_measured_faster_though_predicted_to_verify():
    """A gate that followed the acceptance alone would verify every step here (5 tokens predicted a request):
    measured, a verify step costs 3 plain steps for 1.5 tokens a request, and plain decoding wins."""
    g = gate()
    choices = drive(g, 300, 4, 5.0, plain=(1.0, 4), verify=(3.0, 6))
    assert choices[0] == "verify"
    late = choices[60:]
    assert late.count("plain") > 0.9 * len(late), late
    assert "explore_verify" in late  # still explored, ever more rarely while plain keeps winning
    assert g.bucket(4).gap == GAP_MAX
    assert g.steps["plain"] > 0.9 * 300 - 60


def test_off_when_acceptance_collapses_and_on_when_it_recovers():
    """Drafts that stop being accepted (a verify step emits little more than a plain one) turn verifying off;
    drafts accepted again turn it back on, found by exploring."""
    g = gate()
    good, bad = (1.5, 16), (1.5, 5)
    first = drive(g, 100, 4, 4.0, plain=(1.0, 4), verify=good)
    collapsed = drive(g, 200, 4, 4.0, plain=(1.0, 4), verify=bad)
    recovered = drive(g, 300, 4, 4.0, plain=(1.0, 4), verify=good)
    assert first[-50:].count("verify") > 40
    assert collapsed[-100:].count("plain") > 90, collapsed
    assert recovered[-100:].count("verify") > 90, recovered


def test_buckets_decide_apart_and_pauses_are_clipped():
    """Verify pays at batch 1 and not at 16; a pause between steps (the caller's) moves an average by at most
    a bounded step."""
    g = gate()
    drive(g, 100, 1, 3.0, plain=(1.0, 1), verify=(2.0, 4))
    drive(g, 100, 16, 3.0, plain=(1.0, 16), verify=(4.0, 24))
    assert g.choose(1, 3.0) in ("verify", "explore_plain") and g.choose(16, 3.0) in (
        "plain",
        "explore_verify",
    )
    before = g.bucket(16).plain
    g.commit(16, "plain", False)
    g.clock.now += 1000.0
    g.ended(16, "plain", 16)
    assert g.bucket(16).plain <= before * (1 + 0.3 * 3) + 1e-9


def test_a_plain_step_after_anything_else_is_not_measured():
    """Only the period between two plain steps is the pipeline's; the first after a verify step or a prefill
    also refills the pipeline."""
    g = gate()
    g.ended(4, None, 0)
    g.clock.now += 5.0
    g.ended(4, "plain", 4)
    assert g.bucket(4).plain is None
    g.clock.now += 1.0
    g.ended(4, "plain", 4)
    assert g.bucket(4).plain == 0.25
    g.clock.now += 2.0
    g.ended(4, "verify", 8)
    assert g.bucket(4).verify == 0.25
    g.clock.now += 9.0
    g.ended(4, "plain", 4)
    assert g.bucket(4).plain == 0.25
