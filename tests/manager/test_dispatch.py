"""The dispatch rule the manager and the simulator both ask."""

from laminar.manager.dispatch import Dispatch


def test_laminar_rule_is_flow_control_only():
    rule = Dispatch(groups_per_batch=4, max_outstanding_groups=24)
    assert rule.quota(0, 5, dispatched=0, consumed=0) == 4  # any version may work
    assert rule.quota(3, 3, dispatched=22, consumed=0) == 2
    assert rule.quota(3, 3, dispatched=24, consumed=0) == 0
    assert rule.quota(3, 3, dispatched=24, consumed=8) == 4


def test_repack_frees_only_as_many_replicas_as_there_are_batches_for():
    rule = Dispatch(groups_per_batch=4, max_outstanding_groups=24)
    assert rule.replicas_with_work(dispatched=24, consumed=0) == 0  # buffer full: no repack
    assert rule.replicas_with_work(dispatched=24, consumed=8) == 2
    assert rule.replicas_with_work(dispatched=24, consumed=7) == 1


def test_sync_and_one_step_need_the_trainers_version_and_stop_at_the_batch_end():
    sync = Dispatch(3, 24, groups_per_step=8, ahead=0)
    assert sync.quota(0, 1, dispatched=8, consumed=8) == 0  # must pull version 1 first
    assert sync.quota(1, 1, dispatched=8, consumed=8) == 3
    assert sync.quota(1, 1, dispatched=15, consumed=8) == 1
    one = Dispatch(3, 24, groups_per_step=8, ahead=1)
    assert one.quota(0, 0, dispatched=8, consumed=0) == 3  # batch 1 is generated with version 0
    assert one.quota(0, 0, dispatched=16, consumed=0) == 0


def test_stream_bound_keeps_every_group_within_k_versions():
    rule = Dispatch(4, 24, groups_per_step=8, ahead=2)
    assert rule.quota(0, 0, dispatched=20, consumed=0) == 4
    assert rule.quota(0, 0, dispatched=24, consumed=0) == 0  # group 24 would train at step 4 > 0 + 2 + 1
    assert rule.quota(0, 1, dispatched=0, consumed=0) == 0  # old version: no new work


def test_an_evaluation_is_split_into_one_share_per_replica_however_the_replicas_ask():
    """One replica asking again and again takes a whole share each time (not half of what is left), so an
    evaluation costs each replica about one request."""
    import asyncio

    from laminar.data.records import PromptGroup
    from laminar.manager.dispatcher import Dispatcher
    from laminar.manager.fleet import Fleet

    d = Dispatcher(Fleet(t0=0.0), prompt_pool=None, dispatch=Dispatch(4, 24))
    d.replicas = 2
    d.submit_eval([PromptGroup(-1 - i, [1, 2], 1) for i in range(9)], min_version=3)
    assert d._eval_work(0, version=2) == []  # too old for it
    sizes = [len(asyncio.run(d.next_work(1, version=3))) for _ in range(2)]
    assert sizes == [5, 4] and d.evals == []


def test_max_lag_gives_new_work_only_to_replicas_close_to_the_trainer():
    """`schedule.max_lag` 0: a group starts on the trainer's newest version; the bound in trainer steps
    (3 batches of 8 outstanding) still holds; without `max_lag` any version may work."""
    from laminar.config import load_config
    from laminar.schedules.schedule import Schedule

    rule = Dispatch(groups_per_batch=4, max_outstanding_groups=24, groups_per_step=8, max_lag=0)
    assert rule.quota(2, 3, dispatched=24, consumed=24) == 0  # one version behind: pull first
    assert rule.quota(3, 3, dispatched=24, consumed=24) == 4
    assert rule.quota(3, 3, dispatched=48, consumed=24) == 0  # 3 steps' groups in flight
    assert Dispatch(4, 24, 8, max_lag=1).quota(2, 3, dispatched=24, consumed=24) == 4
    assert Dispatch(4, 24, 8).quota(0, 3, dispatched=24, consumed=24) == 4
    built = Schedule.from_config(load_config(None, ["schedule.max_lag=0"])).dispatch
    assert built.max_lag == 0 and built.ahead is None
    assert Schedule.from_config(load_config(None, [])).dispatch.max_lag == 0  # the runtime's default
    assert Schedule.from_config(load_config(None, ["schedule.max_lag=-1"])).dispatch.max_lag is None


def test_repack_gate_leaves_the_room_to_replicas_already_asking():
    """Replicas refused until they pull (max_lag) take the room first: repack frees only what is left."""
    import asyncio

    from laminar.manager.dispatcher import Dispatcher
    from laminar.manager.fleet import Fleet

    rule = Dispatch(groups_per_batch=4, max_outstanding_groups=24, max_lag=0)
    assert rule.replicas_with_work(dispatched=24, consumed=8, waiting=1) == 1
    assert rule.replicas_with_work(dispatched=24, consumed=8, waiting=3) == 0
    d = Dispatcher(Fleet(t0=0.0), prompt_pool=None, dispatch=rule)
    d.trainer_update(version=2, consumed_groups=8)
    d.dispatched_groups = 24
    assert d.replicas_with_work() == 2
    assert asyncio.run(d.next_work(0, version=1)) == []  # behind: refused, pulls and asks again
    assert d.refused == {0} and d.replicas_with_work() == 1
