"""Host shared-memory weight slots: a few fixed buffers per relay, guarded by reader counts.

A slot is a file in /dev/shm mapped with mmap, so a reader on the same node maps the very pages the relay wrote
(zero copy) by opening the path. Files carry the owner's pid in their name so a later pool can sweep the ones a
killed process left behind.
"""

from __future__ import annotations

import mmap
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
_NAME = re.compile(r"^laminar-(?P<pid>\d+)-[0-9a-f]+-.+$")


def is_slot_name(name: str) -> bool:
    """A file name this module makes for a slot (what a relay may map when its upstream offers it)."""
    return _NAME.match(name) is not None


def sweep_stale(directory: str = SHM_DIR) -> int:
    """Unlink slot files whose owning process is gone (killed relays cannot clean up after themselves)."""
    removed = 0
    for name in os.listdir(directory):
        m = _NAME.match(name)
        if not m:
            continue
        try:
            os.kill(int(m["pid"]), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(directory, name))
                removed += 1
            except FileNotFoundError:
                pass
        except PermissionError:
            pass  # alive, someone else's
    return removed


class ShmBuffer:
    """One named, resizable shared-memory file mapped read-write into this process."""

    def __init__(self, path: str, capacity: int):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.capacity = 0
        self._mm: mmap.mmap | None = None
        self.array = np.empty(0, dtype=np.uint8)
        self.resize(capacity)

    def resize(self, capacity: int) -> None:
        """Grow the file; only called while nobody reads it."""
        if capacity <= self.capacity and self._mm is not None:
            return
        self._unmap()
        os.ftruncate(self.fd, max(capacity, 1))
        self._mm = mmap.mmap(self.fd, max(capacity, 1))
        self.array = np.frombuffer(self._mm, dtype=np.uint8)
        self.capacity = capacity

    def _unmap(self) -> None:
        if self._mm is not None:
            self.array = np.empty(0, dtype=np.uint8)
            try:
                self._mm.close()
            except BufferError:
                pass  # a view escaped; the mapping dies with it
            self._mm = None

    def close(self, unlink: bool = True) -> None:
        self._unmap()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def new_buffer_path(tag: str, index: int, directory: str = SHM_DIR) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.]", "_", tag)[:40]
    return os.path.join(directory, f"laminar-{os.getpid()}-{uuid.uuid4().hex[:8]}-{safe}-{index}")


class MappedView:
    """A mapping of someone else's slot: what a local reader loads weights from, zero copy.

    By default private (copy-on-write): a stray write by the reader stays in its own pages. `shared=True` maps
    the slot's own pages read-only, so a mapping kept across versions always shows what the relay wrote last
    (CUDA registration of a private mapping copies its pages and would freeze an old version). `writable=True`
    maps them read-write: a rank of a sharded trainer writing its rows into the publisher's slot.
    """

    def __init__(self, path: str, nbytes: int, *, shared: bool = False, writable: bool = False):
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ if shared else mmap.ACCESS_COPY
            self._mm = mmap.mmap(fd, max(nbytes, 1), access=access)
        finally:
            os.close(fd)
        self.path, self.nbytes = path, nbytes
        self.array = np.frombuffer(self._mm, dtype=np.uint8, count=nbytes)

    def close(self) -> None:
        self.array = np.empty(0, dtype=np.uint8)
        try:
            self._mm.close()
        except BufferError:
            pass  # the caller kept a view; the mapping stays until it is dropped

    def __enter__(self) -> MappedView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


FREE, WRITING, READY, ABORTED = "free", "writing", "ready", "aborted"


@dataclass
class Slot:
    """A buffer plus what it holds; `ready_chunks` (the chunks in and checked, counted from the first) lets a
    forwarder send chunk i while chunk i+1 arrives. `layout_blob` is the layout as it travels and `digest` the
    version's authentication (wire.version_digest), set once every chunk is in and verified."""

    index: int
    buffer: ShmBuffer
    state: str = FREE
    version: int = -1
    nbytes: int = 0
    layout: Any = None
    chunk_bytes: int = 0
    crcs: list[int] = field(default_factory=list)
    done: bytearray = field(default_factory=bytearray)
    ready_chunks: int = 0
    layout_blob: bytes = b""
    digest: bytes = b""
    readers: int = 0
    t_begin: float = 0.0
    t_complete: float = 0.0

    @property
    def nchunks(self) -> int:
        return len(self.crcs)

    def chunk(self, i: int) -> tuple[int, int]:
        """(offset, length) of chunk i."""
        off = i * self.chunk_bytes
        return off, min(self.chunk_bytes, self.nbytes - off)

    def view(self, i: int) -> np.ndarray:
        off, n = self.chunk(i)
        return self.buffer.array[off : off + n]


def num_chunks(nbytes: int, chunk_bytes: int) -> int:
    return max(1, -(-nbytes // chunk_bytes))


class SlotPool:
    """A fixed set of slots; a slot with readers, being written, or holding the newest version is never reused."""

    def __init__(self, tag: str, num_slots: int = 3, directory: str = SHM_DIR):
        if num_slots < 2:
            raise ValueError(f"num_slots={num_slots}: need at least 2 (newest complete + one arriving)")
        sweep_stale(directory)
        self.cond = threading.Condition()
        self.slots = [Slot(i, ShmBuffer(new_buffer_path(tag, i, directory), 0)) for i in range(num_slots)]
        self._newest: Slot | None = None

    def newest(self) -> Slot | None:
        return self._newest

    def find(self, version: int) -> Slot | None:
        for s in self.slots:
            if s.version == version and s.state in (WRITING, READY):
                return s
        return None

    def held_versions(self) -> list[int]:
        return sorted(s.version for s in self.slots if s.state == READY)

    def claim(
        self,
        version: int,
        nbytes: int,
        layout: Any,
        chunk_bytes: int,
        timeout: float,
        layout_blob: bytes = b"",
    ) -> Slot:
        """Take a slot to write `version` into, waiting for readers to let one go."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                slot = self._reusable()
                if slot is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    states = [(s.index, s.state, s.version, s.readers) for s in self.slots]
                    raise TimeoutError(
                        f"no free weight slot for version {version} after {timeout:.1f}s; "
                        f"(index, state, version, readers) = {states}: readers are holding every slot"
                    )
                self.cond.wait(left)
            slot.buffer.resize(nbytes)
            slot.state, slot.version, slot.nbytes, slot.layout = WRITING, version, nbytes, layout
            slot.chunk_bytes = chunk_bytes
            slot.crcs = [0] * num_chunks(nbytes, chunk_bytes)
            slot.done = bytearray(len(slot.crcs))
            slot.ready_chunks = 0
            slot.layout_blob, slot.digest = layout_blob, b""
            slot.t_begin, slot.t_complete = time.time(), 0.0
            return slot

    def _reusable(self) -> Slot | None:
        candidates = [
            s
            for s in self.slots
            if s.readers == 0 and (s.state in (FREE, ABORTED) or (s.state == READY and s is not self._newest))
        ]
        # Prefer never-used or aborted slots, then the oldest version.
        candidates.sort(key=lambda s: (s.state == READY, s.version))
        return candidates[0] if candidates else None

    def chunk_done(self, slot: Slot, index: int, crc: int) -> None:
        """Chunk `index` is in and checked; chunks may finish out of order (the master copies in parallel)."""
        with self.cond:
            slot.crcs[index] = crc
            slot.done[index] = 1
            while slot.ready_chunks < len(slot.done) and slot.done[slot.ready_chunks]:
                slot.ready_chunks += 1
            self.cond.notify_all()

    def sign(self, slot: Slot, digest: bytes) -> None:
        """The version's digest verified (or was made here): a forwarder may now send END downstream."""
        with self.cond:
            slot.digest = digest
            self.cond.notify_all()

    def complete(self, slot: Slot) -> bool:
        """Expose the slot's version; False when a newer one is already exposed (it stays unexposed)."""
        with self.cond:
            slot.t_complete = time.time()
            if self._newest is not None and self._newest.version >= slot.version:
                slot.state = ABORTED
                self.cond.notify_all()
                return False
            slot.state = READY
            self._newest = slot
            self.cond.notify_all()
            return True

    def abort(self, slot: Slot) -> None:
        with self.cond:
            slot.state = ABORTED
            self.cond.notify_all()

    def acquire(self, slot: Slot) -> None:
        with self.cond:
            slot.readers += 1

    def release(self, slot: Slot) -> None:
        with self.cond:
            if slot.readers <= 0:
                raise RuntimeError(
                    f"slot {slot.index} (version {slot.version}) released more often than acquired"
                )
            slot.readers -= 1
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            for s in self.slots:
                s.buffer.close(unlink=True)
            self._newest = None
            self.cond.notify_all()
