import random

import pytest

from laminar.data.experience_buffer import ExperienceBuffer
from laminar.data.records import Trajectory


def traj(gid, idx, version=0):
    return Trajectory(f"{gid}:{idx}", gid, idx, [1], [2, 3], [-0.1, -0.2], version)


def test_groups_complete_in_any_arrival_order_and_leave_fifo():
    buf = ExperienceBuffer(group_size=3)
    arrivals = [traj(g, i) for g in range(5) for i in range(3)]
    random.Random(0).shuffle(arrivals)
    completed = []
    for t in arrivals:
        before = buf.num_ready()
        buf.add(t)
        if buf.num_ready() > before:
            completed.append(t.group_id)
    assert buf.num_ready() == 5 and not buf.pending
    out = buf.sample(2, version=0) + buf.sample(3, version=0)
    assert [g[0].group_id for g in out] == completed  # first completed, first trained
    for g in out:
        assert [t.sample_idx for t in g] == [0, 1, 2] and len({t.group_id for t in g}) == 1
    assert buf.sample(1, version=0) is None
    assert buf.stats()["consumed"] == 15 and len(buf) == 0


def test_duplicates_are_ignored_and_counted_even_after_consumption():
    buf = ExperienceBuffer(group_size=2)
    assert buf.add(traj(0, 0)) and not buf.add(traj(0, 0))
    buf.add(traj(0, 1))
    buf.sample(1, version=0)
    assert not buf.add(traj(0, 1))
    assert buf.stats()["duplicates"] == 2 and len(buf) == 0


def test_staleness_stats_and_optional_bound():
    buf = ExperienceBuffer(group_size=1, max_staleness=2)
    for gid, v in enumerate([0, 3, 4, 5]):
        buf.add(traj(gid, 0, version=v))
    out = buf.sample(3, version=5)  # version 0 is 5 behind: dropped
    assert [g[0].version for g in out] == [3, 4, 5]
    s = buf.stats()
    assert s["stale_dropped"] == 1
    assert s["staleness"]["max"] == 2 and s["staleness"]["mean"] == pytest.approx(1.0)
    assert s["staleness_hist"] == {0: 1, 1: 1, 2: 1}


def test_full_buffer_evicts_the_oldest_ready_group_and_names_why():
    evict = ExperienceBuffer(group_size=1, capacity=2)
    for g in range(3):
        evict.add(traj(g, 0))
    assert [g[0].group_id for g in evict.sample(2, version=0)] == [1, 2]
    assert evict.stats()["evicted"] == 1 and evict.dropped == {"0:0": "evicted"}


def test_a_group_is_trained_at_one_version_only():
    buf = ExperienceBuffer(group_size=2)
    buf.add(traj(0, 0, 1))
    assert buf.add(traj(0, 1, 2)) and buf.pending[0].keys() == {1}  # issued again: the newer run supersedes
    assert not buf.add(traj(0, 0, 1))  # a late sample of the old run is ignored
    assert buf.add(traj(0, 0, 2)) and [t.version for t in buf.ready[0]] == [2, 2]
    buf.add(traj(1, 0, 3))
    assert buf.restart_group(1, ["1:0", "1:1"], version=2)  # recovery: only version 2 from now on
    assert not buf.pending and not buf.add(traj(1, 0, 3))
    assert buf.add(traj(1, 0, 2)) and buf.add(traj(1, 1, 2)) and buf.num_ready() == 2
    assert not buf.restart_group(1, ["1:0", "1:1"], version=5)  # complete: nothing to restart
    assert buf.stats()["superseded"] == 4 and not buf.dropped


def test_pluggable_sampler():
    buf = ExperienceBuffer(group_size=2, sampler="freshest")
    buf.add(traj(0, 0, 1)), buf.add(traj(0, 1, 1)), buf.add(traj(1, 0, 3)), buf.add(traj(1, 1, 3))
    buf.add(traj(2, 0, 2)), buf.add(traj(2, 1, 4))  # never a group of two versions: 2:0 is superseded
    assert buf.num_ready() == 2 and buf.pending[2].keys() == {1}
    assert buf.sample(1, version=4)[0][0].group_id == 1
    custom = ExperienceBuffer(group_size=1, sampler=lambda ready, k, v: list(range(len(ready)))[-k:])
    for g in range(3):
        custom.add(traj(g, 0))
    assert custom.sample(1, version=0)[0][0].group_id == 2
    with pytest.raises(ValueError, match="sampler='lifo'"):
        ExperienceBuffer(group_size=1, sampler="lifo")


def last_one(ready, count, version):
    """A sampler for the dotted-path test: the newest arrivals."""
    return list(range(len(ready)))[-count:]


def test_oldest_version_first_and_samplers_by_dotted_path():
    buf = ExperienceBuffer(group_size=1, sampler="oldest")
    for gid, version in ((0, 3), (1, 1), (2, 2), (3, 1)):
        buf.add(traj(gid, 0, version))
    assert [g[0].group_id for g in buf.sample(3, version=4)] == [1, 3, 2]  # by version, then arrival
    by_path = ExperienceBuffer(group_size=1, sampler=f"{__name__}:last_one")
    for gid in range(3):
        by_path.add(traj(gid, 0))
    assert by_path.sample(1, version=0)[0][0].group_id == 2
    with pytest.raises(ValueError, match="has no function 'nope'"):
        ExperienceBuffer(group_size=1, sampler=f"{__name__}:nope")
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        ExperienceBuffer(group_size=1, sampler="no_such_module:f")


def test_state_dict_round_trip_loses_and_duplicates_nothing():
    buf = ExperienceBuffer(group_size=2)
    buf.add(traj(0, 0)), buf.add(traj(0, 1)), buf.add(traj(1, 1)), buf.add(traj(2, 0))
    buf.add(traj(3, 0)), buf.add(traj(3, 1))
    buf.sample(1, version=1)
    other = ExperienceBuffer(group_size=2)
    other.load_state_dict(buf.state_dict())
    assert other.stats() == buf.stats()
    assert not other.add(traj(0, 0))  # already trained before the checkpoint
    other.add(traj(1, 0))
    assert [g[0].group_id for g in other.sample(2, version=1)] == [3, 1]
    with pytest.raises(ValueError, match="sample_idx 5"):
        other.add(traj(9, 5))


def test_a_group_restarted_before_a_checkpoint_is_taken_again_at_the_resumed_version():
    """Recovery held group 6 to version 3 just before the checkpoint; the resumed run issues it again at its own
    version (4). Without `resumed` every new sample was refused and the group was lost (the audit caught it)."""
    buf = ExperienceBuffer(group_size=2)
    buf.add(traj(6, 0, 1))
    assert buf.restart_group(6, ["6:0", "6:1"], version=3)
    buf.add(traj(6, 0, 3))  # one sample of the restart made it before the checkpoint
    restored = ExperienceBuffer(group_size=2)
    restored.load_state_dict(buf.state_dict())
    assert restored.resumed() == 1
    assert restored.add(traj(6, 0, 4)) and restored.add(traj(6, 1, 4))  # the newest version wins, whole
    assert [t.version for t in restored.ready[0]] == [4, 4]
