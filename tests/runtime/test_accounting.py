"""The end-of-run count of lost trajectories, by id over the run's whole timeline."""

from laminar.runtime.launch import lost_trajectories


def test_every_issued_trajectory_must_be_somewhere():
    acc = {"issued_groups": 3, "queued_groups": [], "held": {"1:0", "1:1"}, "in_flight": {"2:0"}}
    trained = {"0:0", "0:1"}
    assert lost_trajectories(acc, trained, group_size=2) == 1  # 2:1 is nowhere


def test_groups_queued_for_reissue_are_not_lost():
    acc = {"issued_groups": 3, "queued_groups": [2], "held": {"1:0", "1:1"}, "in_flight": set()}
    assert lost_trajectories(acc, {"0:0", "0:1"}, group_size=2) == 0


def test_trained_before_a_resume_counts():
    """After a resume the trained set holds both segments' ids; groups issued past the checkpoint by the
    first segment and not issued again are beyond `issued_groups` and are not counted."""
    acc = {"issued_groups": 2, "queued_groups": [], "held": set(), "in_flight": set()}
    assert lost_trajectories(acc, {"0:0", "0:1", "1:0", "1:1"}, group_size=2) == 0
