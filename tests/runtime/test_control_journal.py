"""The control actors' journals, without Ray: a second instance over the same journal folder is the restarted
process. It stands where the first one stood, and every changing call, made again (Ray's retry of a call the
lost process had not answered), changes nothing more."""

from __future__ import annotations

import pytest

from laminar.data.records import PromptGroup, Trajectory
from laminar.runtime.control import JournaledPartialPool, JournaledPromptPool, MadeHere, rows_digest
from laminar.runtime.journaled_buffer import JournaledBuffer

ROWS = [{"prompt": f"{i} {i + 1}", "answer": str(i)} for i in range(5)]


def encode(text: str) -> list[int]:
    return [int(x) + 3 for x in text.split()]


def prompt_pool(journal) -> JournaledPromptPool:
    return JournaledPromptPool(ROWS, encode, 2, 7, str(journal))


class Told:
    """Stands for an actor handle the buffer tells of complete groups: records each `.remote` call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str):
        owner = self

        class Method:
            def remote(self, *args):
                owner.calls.append((name, args))

        return Method()


def buffer(journal, told: Told | None = None) -> JournaledBuffer:
    told = told or Told()
    return JournaledBuffer(2, 100, None, told, told, "fifo", str(journal))


def traj(group: int, idx: int, version: int = 0) -> Trajectory:
    return Trajectory(f"{group}:{idx}", group, idx, [3, 4], [5, 6], [-0.5, -0.25], version, reward=1.0)


def test_the_prompt_pool_answers_a_request_once_and_a_restart_goes_on_from_the_same_cursor(tmp_path):
    pool = prompt_pool(tmp_path)
    first = pool.next_groups(2, asker=0, request=1)
    assert pool.next_groups(2, asker=0, request=1) == first  # the manager's call made again
    second = pool.next_groups(1, asker=1, request=1)
    pool.done(first[0].group_id)
    pool.done(first[0].group_id)  # told twice (a restarted buffer tells again)
    restarted = prompt_pool(tmp_path)
    assert restarted.state_dict() == pool.state_dict()
    assert restarted.next_groups(1, asker=1, request=1) == second  # asked again after the restart
    assert restarted.answered() == {0: (1, first), 1: (1, second)}
    assert [g.group_id for g in restarted.next_groups(2, asker=0, request=2)] == [3, 4]


def test_the_partial_pool_adds_a_progress_call_made_twice_once(tmp_path):
    pool = JournaledPartialPool(str(tmp_path))
    group = PromptGroup(4, [3, 4], 2, {"answer": "x"})
    pool.start(group, 0, 1)
    pool.start(group, 0, 1)  # made again
    pool.progress({"4:0": ([7, 8], [-0.1, -0.2])}, {"4:0": 0})
    pool.progress({"4:0": ([7, 8], [-0.1, -0.2])}, {"4:0": 0})  # made again
    pool.progress({"4:0": ([9], [-0.3])}, {"4:0": 2})
    pool.move(["4:1"], 2)
    pool.finish_many(["4:1"])
    pool.restart(group, [1], 3, 2)
    pool.restart(group, [1], 3, 2)  # made again: its progress since stays
    pool.progress({"4:1": ([5], [-0.5])}, {"4:1": 0})
    pool.restart(group, [1], 3, 2)
    restarted = JournaledPartialPool(str(tmp_path))
    assert restarted.snapshot() == pool.snapshot()
    assert restarted.get("4:0").response_ids == [7, 8, 9]
    e = restarted.get("4:1")
    assert (e.replica, e.version, e.restarts, e.response_ids) == (3, 2, 1, [5])
    restarted.progress({"4:0": ([9, 10], [-0.3, -0.4])}, {"4:0": 2})  # overlaps what it has: the rest goes on
    assert restarted.get("4:0").response_ids == [7, 8, 9, 10]
    restarted.progress({"4:0": ([12], [-0.6])}, {"4:0": 5})  # past a gap: the pool keeps the prefix it has
    assert restarted.get("4:0").response_ids == [7, 8, 9, 10]


def test_the_buffer_hands_a_take_out_once_and_a_restart_holds_the_same_groups(tmp_path):
    told = Told()
    buf = buffer(tmp_path, told)
    assert buf.add_many([traj(0, 0), traj(0, 1), traj(1, 0)]) == [True, True, True]
    assert buf.add_many([traj(0, 1)]) == [False]  # made again: a duplicate, ignored
    assert ("done", (0,)) in told.calls and ("done", (1,)) not in told.calls
    buf.add_many([traj(1, 1), traj(2, 0)])
    taken = buf.take(1, 0, 5.0, request=1)
    assert [g[0].group_id for g in taken] == [0]
    assert buf.take(1, 0, 5.0, request=1) == taken  # the driver's call made again: the same group
    told_again = Told()
    restarted = buffer(tmp_path, told_again)
    assert restarted.take(1, 0, 5.0, request=1) == taken  # and after the restart
    assert restarted.state_dict() == buf.state_dict()
    # complete groups are told again (the lost process may have died before it told them)
    assert sorted(args for name, args in told_again.calls if name == "done") == [(0,), (1,)]
    restarted.trained([0])
    assert restarted.add_many([traj(0, 0)]) == [False]  # trained already: never again
    assert [g[0].group_id for g in restarted.take(1, 0, 5.0, request=2)] == [1]
    assert restarted.stats()["duplicates"] == 2


def test_a_group_restarted_twice_at_one_version_keeps_the_samples_of_that_version(tmp_path):
    buf = buffer(tmp_path)
    buf.add_many([traj(5, 0, version=1)])
    assert buf.restart_group(5, ["5:0", "5:1"], 2)
    buf.add_many([traj(5, 0, version=2)])
    assert buf.restart_group(5, ["5:0", "5:1"], 2)  # made again after the restart's samples came
    restarted = buffer(tmp_path)
    assert [t.version for t in restarted.buffer.pending[5].values()] == [2]
    restarted.add_many([traj(5, 1, version=2)])
    assert [t.traj_id for t in restarted.take(1, 2, 5.0, request=1)[0]] == ["5:0", "5:1"]


def test_evaluation_samples_come_once_each_however_often_they_are_asked_for(tmp_path):
    buf = buffer(tmp_path)
    buf.add_eval_many([traj(-1, 0), traj(-2, 0)])
    buf.add_eval_many([traj(-1, 0)])  # made again
    first = buf.take_eval([-1, -2])
    assert {g: [t.traj_id for t in s] for g, s in first.items()} == {-1: ["-1:0"], -2: ["-2:0"]}
    restarted = buffer(tmp_path)
    restarted.add_eval_many([traj(-1, 1)])
    assert [t.traj_id for t in restarted.take_eval([-1], {-1: 1})[-1]] == ["-1:1"]  # past what it holds
    assert restarted.take_eval([-1], {-1: 2}) == {}
    assert -2 not in restarted.evaluated  # no longer asked for: forgotten


def rows_of(count: int) -> list[dict]:
    return ROWS[:count]


def test_a_pool_that_reads_its_rows_itself_stops_a_restart_over_changed_data(tmp_path):
    """The run's pool reads its rows in its own process (`MadeHere`), and a restarted pool reads them again: the
    digest of the rows the run started with stops a restart over data changed meanwhile, with a clear error."""
    first = JournaledPromptPool(MadeHere(rows_of, (5,)), encode, 2, 7, str(tmp_path), rows_digest(ROWS))
    groups = first.next_groups(2, asker=0, request=1)
    again = JournaledPromptPool(MadeHere(rows_of, (5,)), encode, 2, 7, str(tmp_path), rows_digest(ROWS))
    assert again.next_groups(2, asker=0, request=1) == groups  # the restart stands where the first stood
    with pytest.raises(RuntimeError, match="training rows are not those the run started with"):
        JournaledPromptPool(MadeHere(rows_of, (4,)), encode, 2, 7, str(tmp_path), rows_digest(ROWS))
