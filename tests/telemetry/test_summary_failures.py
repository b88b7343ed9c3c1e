"""`summary.json`'s `failures` are counted from the run's own records, the ones `metrics.jsonl` holds."""

from laminar.telemetry.summary import failures


def test_failures_count_every_failure_record_and_what_each_recovery_placed():
    records = [
        {"kind": "failure", "what": "rollout", "replica": 0},  # replaced
        {"kind": "recovery", "replica": 0, "in_flight": 3, "recovered": 2, "restarted": 1, "restarted_groups": 1,
         "tool_reruns": 0},
        {"kind": "failure", "what": "relay", "node": "ab", "replaced": False},
        {"kind": "failure", "what": "rollout", "replica": 2},  # found at the end, never replaced
        {"kind": "recovery", "orphans": 1, "recovered": 1, "restarted": 0, "restarted_groups": 0, "tool_reruns": 1},
        {"kind": "failure", "what": "trainer", "version": 4},
        {"kind": "failure", "what": "buffer", "replaced": True, "version": 4},
        {"kind": "step", "step": 5},
    ]  # fmt: skip
    assert failures(records) == {
        "rollouts": 2,
        "relays": 1,
        "trainer": 1,
        "control": 1,
        "recovered_trajectories": 3,
        "restarted_trajectories": 1,
        "restarted_groups": 1,
        "tool_reruns": 1,
    }
