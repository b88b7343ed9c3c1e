"""`laminar audit`: trained once, duplicated, lost with or without a reason, and a resumed run's segments, from
records shaped as `laminar train` writes them."""

from __future__ import annotations

import json
import time

from laminar.cli import main
from laminar.telemetry.audit import audit_records


def segment(issued: int = 0, resumed_at: int | None = None) -> dict:
    return {"kind": "segment", "resumed_at": resumed_at, "group_size": 2, "issued_groups": issued}


def step(s: int, *groups: int) -> dict:
    return {"kind": "step", "step": s, "traj_versions": {f"{g}:{i}": [s - 1] for g in groups for i in (0, 1)}}


def end(issued: int, in_flight=(), held=(), queued=(), dropped=None) -> dict:
    return {
        "kind": "end",
        "issued_groups": issued,
        "in_flight": list(in_flight),
        "held": list(held),
        "queued_groups": list(queued),
        "dropped": dropped or {},
    }


def test_every_issued_trajectory_trained_once_or_pending_is_ok():
    a = audit_records([segment(), step(1, 0), step(2, 1), end(4, in_flight=["2:0", "2:1"], held=["3:0"])])
    # 3:1 is nowhere: issued, never trained, not held, not in flight
    assert not a.ok and a.unexplained == ["3:1"]
    a = audit_records([segment(), step(1, 0), step(2, 1), end(4, in_flight=["2:0", "2:1"], queued=[3])])
    assert a.ok and (a.issued, a.trained, a.pending) == (8, 4, 4)
    assert a.counts() == {"issued": 8, "trained": 4, "filtered": 0, "lost": 0, "duplicated": 0}


def test_a_trajectory_trained_twice_is_reported():
    a = audit_records([segment(), step(1, 0), step(2, 1, 0), end(2)])
    assert not a.ok and a.duplicated == {"0:0": 2, "0:1": 2} and a.counts()["duplicated"] == 2


def test_losses_with_a_reason_are_counted_but_only_unexplained_ones_fail():
    a = audit_records([segment(), step(1, 0), end(3, dropped={"1:0": "evicted", "1:1": "evicted"})])
    assert a.lost == {"1:0": "evicted", "1:1": "evicted", "2:0": "unexplained", "2:1": "unexplained"}
    assert a.unexplained == ["2:0", "2:1"] and a.counts()["lost"] == 4 and not a.ok
    a = audit_records([segment(), step(1, 0), end(2, dropped={"1:0": "stale", "1:1": "stale"})])
    assert a.ok and a.counts()["lost"] == 2


def test_a_group_trained_with_samples_of_two_versions_is_a_fault():
    mixed = step(1, 0)
    mixed["traj_versions"]["0:1"] = [3]
    a = audit_records([segment(), mixed, end(1)])
    assert not a.ok and "different versions: [0]" in a.problems[0]
    resumed = step(1, 0)  # partial rollout: a trajectory resumed on newer weights began at its first version
    resumed["traj_versions"]["0:1"] = [0, 1]
    assert audit_records([segment(), resumed, end(1)]).ok


def test_a_step_skipped_for_a_non_finite_loss_trained_nothing():
    skipped = {**step(2, 1), "nonfinite": True}
    a = audit_records([segment(), step(1, 0), skipped, end(2)])
    assert a.ok and a.trained == 2 and a.lost == {"1:0": "skipped_step", "1:1": "skipped_step"}


def test_a_resumed_run_counts_the_steps_it_kept_over_both_segments():
    """Segment 1 trained steps 1-3 and checkpointed at step 2, then died without an end record; segment 2
    resumed at step 2, issued group 2 again and trained it at step 3 (segment 1's step 3 was rolled back)."""
    first = [segment(), step(1, 0), step(2, 1), step(3, 2), {"kind": "dispatch", "groups": [3]}]
    second = [segment(issued=3, resumed_at=2), step(3, 2), step(4, 3), end(4)]
    a = audit_records(first + second)
    assert a.ok, a
    assert (a.segments, a.trained, a.rolled_back_steps) == (2, 8, 1)
    # the same files, without the resume: segment 1 never said what it had in flight
    alone = audit_records(first)
    assert not alone.ok and "no `end` record" in alone.problems[0]
    # a resume that trained a group the first segment had already trained before its checkpoint
    again = audit_records(first + [segment(issued=3, resumed_at=2), step(3, 1), step(4, 2, 3), end(4)])
    assert again.duplicated == {"1:0": 2, "1:1": 2}


def test_the_trajectories_file_must_agree_with_the_step_records():
    rows = [{"traj_id": t, "trained_at": 1} for t in ("0:0", "0:1")]
    assert audit_records([segment(), step(1, 0), end(1)], rows).ok
    a = audit_records([segment(), step(1, 0), end(1)], rows[:1])
    assert not a.ok and "disagree" in a.problems[0]


def test_the_command_reads_a_run_folder_and_exits_non_zero_on_a_fault(tmp_path, capsys):
    records = [segment(), step(1, 0), step(2, 0), end(1)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["audit", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "DUPLICATED: 2 ids" in out and out.strip().endswith("FAILED")
    assert main(["audit", str(tmp_path / "nope")]) == 2
    assert "holds no metrics.jsonl" in capsys.readouterr().err


def filtering_step(s: int, trained: list[int], aside: list[int]) -> dict:
    r = step(s, *trained)
    r["filtered_groups"] = len(aside)
    r["filtered_ids"] = [f"{g}:{i}" for g in aside for i in (0, 1)]
    return r


def rows(s: int, trained: list[int], aside: list[int]) -> list[dict]:
    """trajectories.jsonl rows of one step: trained first, then those set aside (`filtered: true`)."""
    out = [{"traj_id": f"{g}:{i}", "trained_at": s} for g in trained for i in (0, 1)]
    return out + [{"traj_id": f"{g}:{i}", "trained_at": s, "filtered": True} for g in aside for i in (0, 1)]


def test_groups_set_aside_by_filter_groups_are_accounted_for_not_lost():
    records = [segment(), filtering_step(1, [0], [1, 2]), filtering_step(2, [4], [3]), end(5)]
    a = audit_records(records, rows(1, [0], [1, 2]) + rows(2, [4], [3]))
    assert a.ok and not a.lost, a.problems
    assert (a.trained, a.filtered, a.filtered_groups) == (4, 6, 3)
    assert a.counts() == {"issued": 10, "trained": 4, "filtered": 6, "lost": 0, "duplicated": 0}
    # the same run without the record of what was set aside: those ids are nowhere
    a = audit_records([segment(), step(1, 0), step(2, 4), end(5)])
    assert not a.ok and a.unexplained == ["1:0", "1:1", "2:0", "2:1", "3:0", "3:1"]


def test_a_group_set_aside_and_also_trained_or_saved_differently_is_a_fault():
    a = audit_records([segment(), filtering_step(1, [0], [1]), filtering_step(2, [1], []), end(2)])
    assert not a.ok and "set aside by filter_groups and also trained" in a.problems[0]
    records = [segment(), filtering_step(1, [0], [1]), end(2)]
    a = audit_records(records, rows(1, [0, 1], []))  # the file says trained, the step says set aside
    assert not a.ok and any("disagree on what was set aside" in p for p in a.problems)


def test_a_rolled_back_step_takes_what_it_set_aside_with_it():
    """Resumed from the checkpoint at step 1: step 2's groups were generated again and trained at step 2."""
    records = [
        segment(),
        filtering_step(1, [0], []),
        filtering_step(2, [1], [2]),
        end(3),
        segment(3, resumed_at=1),
        filtering_step(2, [2], [1]),
        end(3),
    ]
    a = audit_records(records)
    assert a.ok and (a.trained, a.filtered, a.rolled_back_steps) == (4, 2, 1)


def test_the_cost_is_bounded_by_the_ids_the_records_name_not_by_a_count_they_claim():
    from laminar.telemetry.audit import headline

    t0 = time.monotonic()
    a = audit_records([segment(), step(1, 0), end(10**18, in_flight=["1:0", "1:1"])])
    unfinished = audit_records([segment(issued=10**18), step(1, 0)])  # no `end`: issued from the segment
    assert time.monotonic() - t0 < 5
    assert not a.ok and a.trained == 2 and a.pending == 2
    assert a.problems == [
        "the prompt pool counts 1000000000000000000 groups issued, but the records name 2 groups, none past 1"
    ]
    assert not unfinished.ok and any("1000000000000000000 groups issued" in p for p in unfinished.problems)
    line = headline(audit_records([segment(), step(1, 0), step(2, 0), end(2)]))
    assert "\n" not in line and line.startswith(
        "2 ids lost without a reason (issued, never trained and nowhere"
    )
    assert "2 ids trained more than once (e.g. 0:0)" in line
