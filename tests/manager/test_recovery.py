from laminar.data.partial_pool import PartialTrajectory
from laminar.data.records import PromptGroup
from laminar.manager.recovery import plan_recovery, restart_item
from laminar.rollout.replica import sample_seed

GROUP = PromptGroup(group_id=7, prompt_ids=[1, 5, 6, 3], n=2, meta={"sampling": {"max_new_tokens": 9}})


def entry(idx: int, version: int, tokens: list[int]) -> PartialTrajectory:
    return PartialTrajectory(
        GROUP.traj_id(idx),
        7,
        idx,
        list(GROUP.prompt_ids),
        version,
        replica=0,
        response_ids=tokens,
        logprobs=[-0.5] * len(tokens),
    )


def test_same_version_continues_with_its_tokens_and_its_own_sampling_stream():
    plan = plan_recovery([entry(0, 3, [4, 4, 2])], {7: GROUP}, {1: 2, 2: 3}, {"temperature": 1.0}, 11, 0.0)
    assert not plan.restarted
    [(target, [(exported, state)])] = plan.recovered
    assert target == 2 and exported.version == 3
    assert exported.output_token_ids == [4, 4, 2] and exported.logprobs == [-0.5] * 3
    assert exported.params.seed == sample_seed(11, "7:0") and exported.params.max_new_tokens == 9
    assert state.reported == 3 and state.group is GROUP


def test_no_replica_of_its_version_left_means_a_counted_restart_from_the_prompt():
    plan = plan_recovery([entry(1, 3, [4, 4])], {7: GROUP}, {1: 5}, {"temperature": 1.0}, 11, 0.0)
    assert not plan.recovered
    [(target, [(exported, _)])] = plan.restarted
    assert target == 1 and exported.output_token_ids == []


def test_work_spreads_over_the_least_loaded_replicas():
    entries = [entry(0, 3, [1]), entry(1, 3, [2])]
    plan = plan_recovery(entries, {7: GROUP}, {1: 3, 2: 3}, {}, 0, 0.0)
    assert sorted(t for t, _ in plan.recovered) == [1, 2]


def test_restart_item_keeps_the_seed_and_the_rows_sampling():
    exported, state = restart_item(GROUP, 1, {"temperature": 0.7}, 11, 0.0)
    assert exported.request_id == "7:1" and exported.params.seed == sample_seed(11, "7:1")
    assert (
        exported.params.temperature == 0.7 and exported.params.max_new_tokens == 9 and state.sample_idx == 1
    )
