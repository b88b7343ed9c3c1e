"""A replica whose loop raised is dead; the same error over and over stops the run instead of replacing forever.
Reward errors a replica reports with its heartbeat become run records."""

import dataclasses

from laminar.config import Config
from laminar.data.records import ReplicaSnapshot
from laminar.manager.manager import RolloutManager
from laminar.manager.spec import ManagerSpec
from laminar.manager.supervisor import repeated_failure
from laminar.rollout.storing import describe_error
from laminar.schedules.schedule import Schedule


def raise_at_one_place(message: str) -> BaseException:
    try:
        raise ValueError(message)
    except ValueError as e:
        return e


def test_the_same_error_is_the_same_type_at_the_same_place_whatever_its_message():
    a_line, a_kind = describe_error(raise_at_one_place("request '3:0': prompt too long"))
    b_line, b_kind = describe_error(raise_at_one_place("request '7:1': prompt too long"))
    assert a_kind == b_kind and a_kind.startswith("ValueError at ") and "test_replica_errors.py" in a_kind
    assert a_line == "ValueError: request '3:0': prompt too long" != b_line
    try:
        raise KeyError("x")
    except KeyError as e:
        assert describe_error(e)[1] != a_kind


def test_repeated_failure_needs_the_same_error_n_times_in_a_row():
    assert not repeated_failure([], 3)
    assert not repeated_failure(["a", "a"], 3)
    assert repeated_failure(["a", "a", "a"], 3)
    assert not repeated_failure(["a", "a", "b", "a", "a"], 3)
    assert repeated_failure(["b", "a", "a", "a"], 3)
    assert repeated_failure(["b"], 1)


def snapshot(replica: int, **extra) -> ReplicaSnapshot:
    return ReplicaSnapshot(replica, **extra)


def manager(t0: float = 0.0, max_failures_in_a_row: int = 3) -> RolloutManager:
    cfg = Config()
    cfg.rollout.max_failures_in_a_row = max_failures_in_a_row
    return RolloutManager(ManagerSpec.of(cfg), Schedule.from_config(cfg), None, None, t0=t0)


def test_replica_errors_are_logged_with_their_traceback_and_repeats_become_fatal():
    m = manager(max_failures_in_a_row=2)
    first = snapshot(
        0, error="Traceback ...\nValueError: a", error_line="ValueError: a", error_kind="V at f:1"
    )
    m.supervisor.replica_error(first)
    assert m.fatal_error() is None
    m.supervisor.replica_error(
        snapshot(1, error="Traceback ...\nKeyError: b", error_line="KeyError: b", error_kind="K at g:2")
    )
    assert m.fatal_error() is None  # a different error breaks the streak
    m.supervisor.replica_error(dataclasses.replace(first, replica=2))
    assert m.fatal_error() is None
    m.supervisor.replica_error(dataclasses.replace(first, replica=3))
    fatal = m.fatal_error()
    assert fatal.startswith("rollout replicas failed 2 times in a row with the same error, last replica 3")
    assert "ValueError: a" in fatal and "\n" not in fatal
    logged = [e for e in m.fleet.events if e["kind"] == "replica_error"]
    assert [e["replica"] for e in logged] == [0, 1, 2, 3] and logged[0]["traceback"].startswith("Traceback")


def test_reward_errors_in_a_heartbeat_become_records_and_stay_out_of_the_timeline():
    m = manager(t0=100.0)
    err = {"traj_id": "5:2", "row": 9, "error_kind": "not_a_number", "error": "returned str 'x'"}
    m.heartbeat(snapshot(4, reward_errors=[err], error=None, error_line="", error_kind=""), 101.5)
    [event] = m.fleet.events
    assert event == {"kind": "reward_error", "t": 1.5, "replica": 4, **err}
    [row] = m.dispatcher.timeline
    assert "reward_errors" not in row and "error" not in row and row["replica"] == 4


def test_reward_errors_a_dead_replica_never_sent_are_logged_with_its_error():
    """A replica whose loop died sends no more heartbeats: the reward errors it scored since its last one come in
    the snapshot the supervisor reads, and are logged once however often it is read."""
    m = manager()
    err = {"traj_id": "3:1", "row": 4, "error_kind": "raised", "error": "ValueError: x"}
    dead = snapshot(2, error="Traceback ...\nKeyError: y", error_line="KeyError: y", reward_errors=[err])
    m.supervisor.replica_error(dead)
    m.supervisor.replica_error(dead)
    logged = [e for e in m.fleet.events if e["kind"] == "reward_error"]
    assert len(logged) == 1 and logged[0]["replica"] == 2 and logged[0]["traj_id"] == "3:1"
