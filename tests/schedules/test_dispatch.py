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
