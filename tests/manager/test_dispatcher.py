"""The manager's dispatcher: work to replicas as the schedule's rule (`laminar.schedules.dispatch`) allows."""

from laminar.schedules.dispatch import Dispatch


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


def test_the_staleness_bound_reads_the_oldest_group_still_owed_and_survives_a_restart():
    """The dispatcher gives the rule the oldest version a group still being generated holds (`Fleet.owed_version`,
    written with each dispatch and each recovery, cleared when the group completes or its replica is forgotten),
    and a restarted manager's journal state keeps it."""
    import asyncio
    from dataclasses import asdict

    from laminar.data.records import PromptGroup
    from laminar.manager.dispatcher import Dispatcher
    from laminar.manager.fleet import Fleet

    rule = Dispatch(
        groups_per_batch=4, max_outstanding_groups=24, groups_per_step=8, max_lag=0, max_staleness=2
    )
    fleet = Fleet(t0=0.0)
    d = Dispatcher(fleet, prompt_pool=None, dispatch=rule)
    old = [PromptGroup(i, [1, 2], 2) for i in range(2)]
    d.change("dispatch", replica=0, request=1, eval=False, groups=[asdict(g) for g in old], version=1)
    d.dispatched_groups = 24  # 22 more went out since, and 16 were trained
    d.trainer_update(version=3, consumed_groups=16)
    assert fleet.oldest_owed() == 1
    assert asyncio.run(d.next_work(1, version=3)) == []  # 8 out: all the oldest group's bound allows
    assert d.replicas_with_work() == 0
    fleet.settle(0)
    assert fleet.oldest_owed() == 1  # group 1 still runs
    fleet.owe(2, old[1], version=2)  # recovery restarted it on a replica of version 2
    fleet.forget(0)
    assert d.refused == {1}  # idle and asking: the room is its own first
    assert fleet.oldest_owed() == 2 and d.replicas_with_work() == 2 - 1
    fleet.owe(3, old[1])  # a repack move keeps its version
    restarted = Fleet(t0=0.0)
    restarted.load(fleet.state())
    assert restarted.oldest_owed() == 2
    fleet.settle(1)
    assert fleet.oldest_owed() is None and d.replicas_with_work() == 4 - 1
