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
