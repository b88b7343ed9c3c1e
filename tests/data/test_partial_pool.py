import json

import pytest

from laminar.data.partial_pool import PartialPool
from laminar.data.records import PromptGroup


def test_progress_move_finish_and_snapshot():
    pool = PartialPool()
    pool.start(PromptGroup(7, [1, 2], n=3, meta={"answer": "x"}), replica=0, version=4)
    pool.start(PromptGroup(8, [1, 5], n=1), replica=1, version=4)
    pool.progress({"7:0": ([3, 4], [-0.1, -0.2]), "7:1": ([5], [-0.3]), "gone:0": ([1], [0.0])})
    pool.append("7:0", [6], [-0.4])
    e = pool.get("7:0")
    assert e.response_ids == [3, 4, 6] and e.logprobs == [-0.1, -0.2, -0.4] and e.version == 4
    assert e.meta == {"answer": "x"} and e.group() == PromptGroup(7, [1, 2], n=3, meta={"answer": "x"})
    assert {x.traj_id for x in pool.on_replica(0)} == {"7:0", "7:1", "7:2"}
    pool.move(["7:1", "gone:0"], 1)  # an id that finished meanwhile is skipped
    assert {x.traj_id for x in pool.on_replica(1)} == {"7:1", "8:0"}

    snap = pool.snapshot()
    pool.append("7:0", [9], [-1.0])  # later progress must not leak into the snapshot
    other = PartialPool()
    other.restore(snap)
    assert other.get("7:0").response_ids == [3, 4, 6]
    assert other.stats()["moved"] == 1 and len(other) == 4

    assert pool.finish("7:2").traj_id == "7:2" and "7:2" not in pool
    assert pool.finish("7:2") is None
    assert {e.traj_id for e in pool.of_groups([7])} == {"7:0", "7:1"}


def test_restart_clears_progress_and_counts_it():
    pool = PartialPool()
    group = PromptGroup(1, [1], n=2, meta={"answer": "x"})
    pool.start(group, replica=0, version=2)
    pool.append("1:0", [3, 3], [-1.0, -1.0])
    pool.finish("1:1")
    pool.restart(group, [0, 1], replica=2, version=5)  # 1:1 had left the pool: registered again
    for tid in ("1:0", "1:1"):
        e = pool.get(tid)
        assert e.response_ids == [] and e.version == 5 and e.replica == 2 and e.restarts == 1
        assert e.meta == {"answer": "x"}
    assert pool.stats()["restarted"] == 2


def test_errors_name_the_trajectory():
    pool = PartialPool()
    pool.start(PromptGroup(1, [1], n=1), replica=0, version=0)
    with pytest.raises(KeyError, match="already in flight"):
        pool.start(PromptGroup(1, [1], n=1), replica=1, version=0)
    with pytest.raises(KeyError, match="9:0 is not in flight"):
        pool.append("9:0", [1], [0.0])
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        pool.append("1:0", [1, 2], [0.0])


def test_tool_turns_keep_their_mask_and_tool_state_through_a_checkpoint():
    pool = PartialPool()
    pool.start(PromptGroup(7, [1, 2], n=1), replica=0, version=4)
    pool.progress({"7:0": ([3, 4], [-0.1, -0.2])})  # before its first call: sampled tokens only
    parked = {"calls": 1, "call": {"name": "python", "arguments": "1+1", "raw": "", "error": ""}}
    pool.progress({"7:0": ([5], [-0.3], [1], parked)})
    pool.progress({"7:0": ([8, 8], [0.0, 0.0], [0, 0], {"calls": 1, "call": None})})  # the output, resumed
    pool.progress({"7:0": ([6], [-0.4])})  # a later report without tools: sampled, state as it was
    restored = PartialPool()
    restored.restore(json.loads(json.dumps(pool.snapshot())))
    e = restored.get("7:0")
    assert e.response_ids == [3, 4, 5, 8, 8, 6] and e.loss_mask == [1, 1, 1, 0, 0, 1]
    assert e.tool == {"calls": 1, "call": None}
    with pytest.raises(ValueError, match="a mask of 1"):
        pool.append("7:0", [1, 2], [0.0, 0.0], [1])
