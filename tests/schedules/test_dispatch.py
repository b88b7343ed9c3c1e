"""The dispatch rule of a schedule, which the manager and the simulator both ask."""

from laminar.schedules.dispatch import Dispatch


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


def test_max_lag_gives_new_work_only_to_replicas_close_to_the_trainer():
    """`schedule.max_lag` 0: a group starts on the trainer's newest version; the bound in trainer steps
    (3 batches of 8 outstanding) still holds; without `max_lag` any version may work."""
    from laminar.configure import load_config
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
    assert Schedule.from_config(load_config(None, ["schedule.max_lag=null"])).dispatch.max_lag is None


def test_max_staleness_holds_new_work_back_while_an_old_group_still_runs():
    """`schedule.max_staleness` k: with the oldest group still generating at version o and the trainer at v,
    at most (o + k + 1 - v) steps' groups may be out, so the trainer cannot pass o + k without that group."""
    from laminar.configure import load_config
    from laminar.schedules.schedule import Schedule

    rule = Dispatch(4, 24, groups_per_step=8, max_lag=0, max_staleness=2)
    assert rule.quota(3, 3, dispatched=24, consumed=16, oldest=3) == 4  # fresh work out: capacity alone
    assert rule.quota(3, 3, dispatched=24, consumed=16, oldest=None) == 4
    # a group of version 1 still runs at trainer version 3: 8 out, room for (1 + 2 + 1 - 3) * 8 - 8 = 0
    assert rule.quota(3, 3, dispatched=24, consumed=16, oldest=1) == 0
    assert rule.quota(3, 3, dispatched=22, consumed=16, oldest=1) == 2
    assert rule.quota(3, 3, dispatched=24, consumed=16, oldest=2) == 4  # one version younger: 8 more
    assert rule.replicas_with_work(24, 16, trainer_version=3, oldest=1) == 0
    assert rule.replicas_with_work(24, 16, trainer_version=3, oldest=3) == 4
    # the version of the work asked for counts when it is the oldest (max_lag lets an old replica work)
    lagging = Dispatch(4, 24, groups_per_step=8, max_staleness=2)
    assert lagging.quota(1, 3, dispatched=24, consumed=16, oldest=None) == 0
    assert Dispatch(4, 24, 8).quota(3, 3, dispatched=24, consumed=16, oldest=0) == 4  # no bound
    assert Schedule.from_config(load_config(None, [])).dispatch.max_staleness == 4  # the runtime's default
    free = Schedule.from_config(load_config(None, ["schedule.max_staleness=null"])).dispatch
    assert free.max_staleness is None
    assert Schedule.from_config(load_config(None, ["schedule.name=stream"])).dispatch.max_staleness is None


def test_max_staleness_never_lets_a_group_train_more_than_k_versions_late():
    """The rule alone, against an adversary: groups finish in any order, the oldest last; the trainer takes
    complete groups first-finished first, `groups_per_step` a step, and the manager hears of each step late.
    No group is ever taken more than k versions after the one it was dispatched on."""
    import random

    for seed in range(200):
        rnd = random.Random(seed)
        k, g = rnd.randint(0, 4), rnd.choice([1, 2, 4, 8])
        rule = Dispatch(
            rnd.choice([1, 2, 4]), rnd.choice([g, 2 * g, 3 * g, 6 * g]), g, max_lag=0, max_staleness=k
        )
        version, running, complete, dispatched, consumed = 0, {}, [], 0, 0
        seen = (0, 0)  # (version, consumed) as the manager last heard them
        for _ in range(300):
            act = rnd.random()
            if act < 0.4:  # a replica on the manager's version asks
                oldest = min(running.values(), default=None)
                n = rule.quota(seen[0], seen[0], dispatched, seen[1], oldest)
                for gid in range(dispatched, dispatched + n):
                    running[gid] = seen[0]
                dispatched += n
            elif act < 0.7 and running:  # a group completes; the oldest rarely
                gids = sorted(running, key=lambda x: (running[x], x))
                gid = gids[-1] if rnd.random() < 0.9 else gids[0]
                complete.append((gid, running.pop(gid)))
            elif act < 0.9 and len(complete) >= g:  # a trainer step, first completed first
                for _gid, v in complete[:g]:
                    assert version - v <= k, (seed, version, v, k)
                del complete[:g]
                version, consumed = version + 1, consumed + g
            else:
                seen = (version, consumed)
