"""A control actor's journal: what its restarted self reads back is what it wrote before answering, through
compactions, a kill in the middle of one, and a last line cut short."""

from __future__ import annotations

import json

import pytest

from laminar.journal import Journal, JournalError


class Counter:
    """A tiny journaled state: a list of numbers."""

    def __init__(self, directory, min_bytes: int = 1 << 20) -> None:
        self.values: list[int] = []
        self.journal = Journal(directory, "counter", lambda: {"values": list(self.values)}, min_bytes)
        state, records = self.journal.replay()
        self.values = list(state["values"]) if state is not None else []
        for r in records:
            self.values.append(r["value"])

    def add(self, value: int) -> None:
        self.values.append(value)
        self.journal.append({"value": value})


def test_a_restarted_reader_gets_every_record_in_order(tmp_path):
    c = Counter(tmp_path)
    assert c.journal.replay() == (None, [])  # a first incarnation: nothing to replay
    for v in range(5):
        c.add(v)
    assert Counter(tmp_path).values == [0, 1, 2, 3, 4]


def test_the_tail_is_compacted_into_a_snapshot_and_stays_bounded(tmp_path):
    c = Counter(tmp_path, min_bytes=200)
    for v in range(500):
        c.add(v)
        assert c.journal.size <= c.journal.limit
    assert (tmp_path / "counter.snapshot.json").exists()
    assert (tmp_path / "counter.jsonl").stat().st_size <= c.journal.limit
    again = Counter(tmp_path, min_bytes=200)
    assert again.values == list(range(500))
    again.add(500)  # numbering goes on after the snapshot's
    assert Counter(tmp_path, min_bytes=200).values == list(range(501))


def test_records_the_snapshot_already_holds_are_not_applied_twice(tmp_path):
    """A kill between the snapshot's rename and the tail's truncation leaves both: the tail's records are in it."""
    c = Counter(tmp_path)
    for v in range(3):
        c.add(v)
    snapshot = {"seq": c.journal.seq, "state": {"values": list(c.values)}}
    (tmp_path / "counter.snapshot.json").write_text(json.dumps(snapshot))
    c.add(3)
    assert Counter(tmp_path).values == [0, 1, 2, 3]


def test_a_last_line_cut_short_by_the_kill_is_dropped_and_the_journal_goes_on(tmp_path):
    c = Counter(tmp_path)
    c.add(1)
    with open(tmp_path / "counter.jsonl", "ab") as f:
        f.write(b'{"seq":2,"val')  # the write the kill cut short: never acknowledged
    again = Counter(tmp_path)
    assert again.values == [1]
    again.add(2)
    assert Counter(tmp_path).values == [1, 2]


def test_a_damaged_journal_says_where(tmp_path):
    c = Counter(tmp_path)
    c.add(1)
    with open(tmp_path / "counter.jsonl", "ab") as f:
        f.write(b"garbage\n")
    c.add(2)
    with pytest.raises(JournalError, match=r"counter.jsonl:2: not JSON"):
        Counter(tmp_path)


def test_a_number_out_of_range_is_written_as_null_as_in_every_json_file_of_a_run(tmp_path):
    j = Journal(tmp_path, "strict", lambda: {})
    j.append({"x": float("nan"), "y": [1.5, float("-inf")]})
    assert j.replay()[1] == [{"seq": 1, "x": None, "y": [1.5, None]}]
