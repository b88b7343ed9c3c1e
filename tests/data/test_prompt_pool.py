import pytest

from laminar.data.dataset import DatasetError
from laminar.data.prompt_pool import PromptPool


def rows(k):
    return [{"prompt": f"p{i}", "answer": str(i)} for i in range(k)]


def encode(text):
    return [1, len(text)]


def test_group_ids_are_unique_and_increasing_across_epochs():
    pool = PromptPool(rows(5), encode, n=4, seed=3)
    groups = pool.next_groups(12)
    assert [g.group_id for g in groups] == list(range(12))
    assert all(g.n == 4 for g in groups)
    first_epoch = sorted(g.meta["row"] for g in groups[:5])
    assert first_epoch == [0, 1, 2, 3, 4]  # every row once per epoch
    assert [g.meta["epoch"] for g in groups] == [0] * 5 + [1] * 5 + [2] * 2
    assert groups[0].meta["answer"] == str(groups[0].meta["row"])


def test_given_back_groups_are_reissued_first_with_the_same_id():
    pool = PromptPool(rows(10), encode, n=2)
    a = pool.next_groups(3)
    pool.give_back([a[1]])
    b = pool.next_groups(2)
    assert b[0].group_id == a[1].group_id and b[1].group_id == 3
    with pytest.raises(KeyError, match="not outstanding"):
        pool.give_back([a[1], a[1]])  # not outstanding twice


def test_state_dict_resumes_the_same_sequence():
    pool = PromptPool(rows(7), encode, n=2, seed=5)
    pool.next_groups(9)
    pool.give_back(pool.next_groups(1))
    pool.done(0)
    state = pool.state_dict()
    want = [(g.group_id, g.meta["row"]) for g in pool.next_groups(10)]
    again = PromptPool(rows(7), encode, n=2, seed=5)
    again.load_state_dict(state)
    assert [(g.group_id, g.meta["row"]) for g in again.next_groups(10)] == want
    assert 0 not in again.outstanding and 1 in again.outstanding


def test_reissue_outstanding_after_restore_loses_nothing():
    pool = PromptPool(rows(4), encode, n=1)
    issued = pool.next_groups(3)
    pool.done(issued[0].group_id)
    assert pool.reissue_outstanding() == 2
    assert [g.group_id for g in pool.next_groups(2)] == [1, 2]


def test_malformed_rows_name_the_row_and_field():
    with pytest.raises(DatasetError, match="row 1: missing field 'prompt'"):
        PromptPool([{"prompt": "a"}, {"question": "b"}], encode, n=1)
    with pytest.raises(DatasetError, match="row 0: field 'prompt' must be a string or a list of .*, got int"):
        PromptPool([{"prompt": 3}], encode, n=1)
    with pytest.raises(ValueError, match="no rows"):
        PromptPool([], encode, n=1)

    def bad_encode(text):
        raise KeyError(text)

    with pytest.raises(ValueError, match="row 0: cannot encode field 'prompt'"):
        PromptPool([{"prompt": "x"}], bad_encode, n=1, shuffle=False).next_groups(1)
