"""Slot pool rules: a slot with readers, being written, or holding the newest version is never reused."""

from __future__ import annotations

import os

import numpy as np
import pytest

from laminar.relay.slots import READY, MappedView, SlotPool, sweep_stale


def fill(pool: SlotPool, version: int, nbytes: int = 1000) -> None:
    slot = pool.claim(version, nbytes, {"v": version}, 256, timeout=1.0)
    slot.buffer.array[:nbytes] = version % 256
    for i in range(slot.nchunks):
        pool.chunk_done(slot, i, 0)
    assert pool.complete(slot)


def test_newest_is_never_reused_and_readers_pin_their_slot():
    pool = SlotPool("t-pin", num_slots=2)
    try:
        fill(pool, 1)
        pinned = pool.newest()
        pool.acquire(pinned)
        fill(pool, 2)  # the other slot
        with pytest.raises(TimeoutError, match="readers are holding every slot"):
            pool.claim(3, 1000, None, 256, timeout=0.2)  # v1 is read, v2 is newest
        assert pinned.version == 1 and pinned.state == READY
        assert np.all(pinned.buffer.array[:1000] == 1)
        pool.release(pinned)
        fill(pool, 3)  # now v1's slot is reusable
        assert pool.held_versions() == [2, 3]
        with pytest.raises(RuntimeError, match="released more often"):
            pool.release(pinned)
    finally:
        pool.close()


def test_reader_maps_the_same_pages_and_close_unlinks():
    pool = SlotPool("t-map", num_slots=2)
    fill(pool, 7, nbytes=5000)
    s = pool.newest()
    with MappedView(s.buffer.path, s.nbytes) as view:
        assert view.array.shape == (5000,) and np.all(view.array == 7)
        view.array[0] = 99  # copy-on-write: the slot keeps its bytes
    assert s.buffer.array[0] == 7
    path = s.buffer.path
    pool.close()
    assert not os.path.exists(path)


def test_sweep_removes_files_of_dead_processes(tmp_path):
    dead = tmp_path / "laminar-999999999-deadbeef-x-0"
    alive = tmp_path / f"laminar-{os.getpid()}-deadbeef-x-0"
    dead.write_bytes(b"x")
    alive.write_bytes(b"x")
    assert sweep_stale(str(tmp_path)) == 1
    assert not dead.exists() and alive.exists()


def test_bad_pool_size():
    with pytest.raises(ValueError, match="num_slots=1"):
        SlotPool("t-bad", num_slots=1)
