"""The trainer's side of the weight path: copy a version into local shared memory, tell the master, go on.

The trainer's stall is the copy into a publish slot plus one non-blocking actor call; the chain's length never
enters it. The master relay's `ingest` call for a slot resolves once the master has read (or skipped) that
slot, which is how the publisher knows the slot may be overwritten, without asking anyone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
import torch

from laminar.relay import pinning
from laminar.relay.slots import MappedView, ShmBuffer, new_buffer_path, sweep_stale

log = logging.getLogger(__name__)


def layout_nbytes(layout: Any) -> int | None:
    """Total bytes a layout describes, when it says (the engine's WeightLayout does)."""
    for attr in ("nbytes", "total_bytes", "numel_bytes"):
        n = getattr(layout, attr, None)
        if isinstance(n, int | np.integer):
            return int(n)
    return None


def as_flat_bytes(x: Any) -> np.ndarray:
    """A flat uint8 view of a numpy array or a CPU torch tensor (no copy)."""
    if isinstance(x, np.ndarray):
        arr = x
    elif hasattr(x, "detach") and hasattr(x, "numpy"):
        arr = x.detach().cpu().numpy()
    else:
        raise TypeError(
            f"expected a flat numpy array, a torch tensor or a state_dict, got {type(x).__name__}"
        )
    if not arr.flags.c_contiguous:
        raise ValueError("flat weights must be C-contiguous")
    return arr.reshape(-1).view(np.uint8)


class WeightPublisher:
    """Owned by the trainer process; the master relay must run on the same node (it maps our slots)."""

    def __init__(
        self,
        master: Any,
        *,
        num_slots: int = 3,
        timeout: float = 60.0,
        tag: str = "publish",
        pin: bool | None = None,
    ):
        """`pin`: register the slots with CUDA so a GPU trainer's copy out runs at PCIe speed (None: if CUDA)."""
        if num_slots < 2:
            raise ValueError(f"num_slots={num_slots}: need at least 2 so a publish never waits for a read")
        if pin and not pinning.cuda_available():
            raise ValueError(
                "pin=True registers slots with CUDA, but CUDA is not available here; use pin=None"
            )
        self._pin = pinning.cuda_available() if pin is None else pin
        self._registered: list[bool] = []
        self._preparing: threading.Thread | None = None  # `prepare`'s slot registration, until it ends
        self.prepare_s: float | None = None  # how long it took
        sweep_stale()
        self._master = master
        self._timeout = timeout
        self._tag = tag
        self._num_slots = num_slots
        self._slots: list[ShmBuffer] = []
        self._pending: list[Any] = []  # per slot: the master's ingest ObjectRef, or None when free
        self._layout: Any = None
        self.last_version: int | None = None
        self._resend = False  # a new master holds nothing: the last version may go out once more
        self.stalls: list[float] = []
        self.publish_times: dict[int, float] = {}
        self.errors: list[str] = []

    def set_master(self, master: Any) -> None:
        """Point at a new master relay (the old one died). It holds nothing yet, so the next publish may be the
        last published version again (the trainer's republish)."""
        self._master = master
        self._resend = True

    def _check_version(self, version: int) -> None:
        """Versions only grow, but for the last one again into a new master (`set_master`)."""
        last = self.last_version
        if last is not None and (version < last or (version == last and not self._resend)):
            raise ValueError(f"version {version} must be greater than the last published {last}")

    def publish(
        self,
        version: int,
        state_or_flat: Any,
        layout: Any = None,
        check: Callable[[], None] | None = None,
        t0: float | None = None,
    ) -> float:
        """Publish `version` (a state_dict, or flat uint8 bytes with their `layout`); returns the stall in s,
        since `t0` (perf_counter; default: now). `check` runs once the slot is written and before the master
        relay hears of it: an error it raises leaves the slot free and the version unpublished (the trainer
        judges its weights while they copy)."""
        t0 = time.perf_counter() if t0 is None else t0
        wall0 = time.time()
        self._check_version(version)
        if isinstance(state_or_flat, dict):
            slot, layout, nbytes = self._write_state_dict(state_or_flat)
        else:
            flat = as_flat_bytes(state_or_flat)
            if layout is None:
                raise ValueError("publishing flat bytes needs their layout (the engine unflattens with it)")
            expect = layout_nbytes(layout)
            if expect is not None and expect != flat.nbytes:
                raise ValueError(f"layout describes {expect} bytes but the flat buffer has {flat.nbytes}")
            nbytes = flat.nbytes
            slot = self._free_slot(nbytes)
            np.copyto(self._slots[slot].array[:nbytes], flat)
        if check is not None:
            check()
        return self.commit(slot, version, nbytes, layout, t0, wall0)

    def reserve(self, nbytes: int) -> tuple[int, str]:
        """A free slot of at least `nbytes` and its path: a sharded trainer's ranks write their rows into it
        (`ShardWriter`), then this publisher `commit`s it."""
        slot = self._free_slot(nbytes)
        return slot, self._slots[slot].path

    def commit(
        self,
        slot: int,
        version: int,
        nbytes: int,
        layout: Any,
        t0: float,
        wall0: float | None = None,
        pieces: int = 0,
    ) -> float:
        """Hand a written slot to the master relay; returns the stall since `t0` (perf_counter). `pieces`: how
        many ranks on other machines send their rows to the master relay themselves (`ShardWriter.pack`)."""
        self._check_version(version)
        self._pending[slot] = self._master.ingest.remote(
            version, self._slots[slot].path, nbytes, layout, pieces=pieces
        )
        self.last_version, self._resend = version, False
        stall = time.perf_counter() - t0
        self.stalls.append(stall)
        self.publish_times[version] = time.time() - stall if wall0 is None else wall0
        return stall

    def _write_state_dict(self, state: dict[str, Any]) -> tuple[int, Any, int]:
        from laminar.engine.layout import WeightLayout  # the engine owns the flat format
        from laminar.engine.weights import flatten_into

        if self._layout is None:
            self._layout = WeightLayout.of(state)
        nbytes = self._layout.total_bytes
        slot = self._free_slot(nbytes)
        flatten_into(state, self._layout, self._slots[slot].array[:nbytes])
        return slot, self._layout, nbytes

    def prepare(self, nbytes: int) -> None:
        """Make the slots for versions of `nbytes` now, and in a background thread page-lock them (or, without
        CUDA, touch their pages), so the first publishes do not pay for it: a slot's pages are first touched
        when it is registered, about 15 s a slot at a 14B shape, which the first publish into each slot
        otherwise stalls on. A publish that comes before the thread ends waits for it."""
        if self._slots or nbytes <= 0:
            return
        self._make_slots(nbytes)
        self._preparing = threading.Thread(target=self._prepare_slots, name="publish-slots", daemon=True)
        self._preparing.start()

    def _prepare_slots(self) -> None:
        t0 = time.perf_counter()
        for i, buf in enumerate(self._slots):
            if self._pin:
                self._registered[i] = pinning.register(buf.array, read_only=False)
            else:
                buf.array[::4096] = 0  # a byte a page: the pages exist before the first copy in
        self.prepare_s = time.perf_counter() - t0

    @property
    def slot_paths(self) -> list[str]:
        """The shared-memory files of the publish slots, in order (none before the first `prepare` or publish)."""
        return [buf.path for buf in self._slots]

    def wait_prepared(self) -> None:
        """Until `prepare`'s background work has ended (a publish waits for it by itself)."""
        if self._preparing is not None:
            self._preparing.join()
            self._preparing = None

    def _make_slots(self, nbytes: int) -> None:
        for i in range(self._num_slots):
            self._slots.append(ShmBuffer(new_buffer_path(self._tag, i), nbytes))
            self._pending.append(None)
            self._registered.append(False)

    def _free_slot(self, nbytes: int) -> int:
        """A slot the master is not reading; waits (bounded) only if the master fell behind by num_slots."""
        self.wait_prepared()
        if not self._slots:
            self._make_slots(nbytes)
        self._collect()
        free = [i for i, ref in enumerate(self._pending) if ref is None]
        if not free:
            refs = [r for r in self._pending if r is not None]
            ready, _ = ray.wait(refs, num_returns=1, timeout=self._timeout)
            if not ready:
                raise TimeoutError(
                    f"the master relay has read none of the {self._num_slots} publish slots in {self._timeout:.0f}s; "
                    "is it alive and on this node?"
                )
            self._collect()
            free = [i for i, ref in enumerate(self._pending) if ref is None]
        slot = free[0]
        buf = self._slots[slot]
        if buf.capacity < nbytes:
            if self._registered[slot]:
                pinning.unregister(buf.array)
                self._registered[slot] = False
            buf.resize(nbytes)
        if self._pin and not self._registered[slot]:
            self._registered[slot] = pinning.register(buf.array, read_only=False)
        return slot

    def _collect(self) -> None:
        """Free the slots whose ingest resolved; a failed one is logged, never raised into training."""
        refs = [r for r in self._pending if r is not None]
        if not refs:
            return
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for r in ready:
            i = self._pending.index(r)
            self._pending[i] = None
            try:
                ray.get(r)
            except Exception as e:  # noqa: BLE001 - a dead master must not stop training
                self.errors.append(repr(e))
                log.warning("publish slot %d: master relay failed: %r", i, e)

    def poll(self) -> None:
        """Reclaim slots the master has finished with (publish does this too)."""
        self._collect()

    def close(self) -> None:
        self.wait_prepared()
        for buf, registered in zip(self._slots, self._registered):
            if registered:
                pinning.unregister(buf.array)
            buf.close(unlink=True)
        self._slots, self._pending, self._registered = [], [], []


class ShardWriter:
    """One rank of a sharded trainer: writes its rows of each tensor straight into the publish slot at their
    offsets in the flat layout (the slot is rank 0's publisher's, on the same machine), so no rank gathers
    the whole model. The mapping is kept, and registered with CUDA on a GPU, across versions."""

    def __init__(self) -> None:
        self._views: dict[str, MappedView] = {}
        self._pinned: set[str] = set()

    @staticmethod
    def placed(layout: Any, shards: list[Any]) -> list[tuple[int, int, torch.Tensor]]:
        """(offset in the flat layout, bytes, rows) of each non-empty shard. `shards`: objects with `name`,
        `first_row` and `local` (this rank's rows, on any device)."""
        entry = {e.name: e for e in layout.entries}
        out = []
        for sh in shards:
            e = entry[sh.name]
            if sh.local.numel() == 0:
                continue
            row_bytes = e.nbytes // e.shape[0] if e.shape else e.nbytes
            n = sh.local.numel() * sh.local.element_size()
            if sh.first_row * row_bytes + n > e.nbytes:
                raise ValueError(f"{sh.name}: rows from {sh.first_row} ({n} bytes) pass the tensor's end")
            out.append((e.offset + sh.first_row * row_bytes, n, sh.local))
        return out

    def write(self, path: str, layout: Any, shards: list[Any]) -> None:
        """This rank's rows into the publish slot at `path`, each at its offset."""
        dst = torch.from_numpy(self._map(path, layout.total_bytes).array)
        cuda = False
        for start, n, x in self.placed(layout, shards):
            dst[start : start + n].view(x.dtype).view(x.shape).copy_(x, non_blocking=True)
            cuda |= x.is_cuda
        if cuda:
            torch.cuda.synchronize()

    def pack(self, layout: Any, shards: list[Any]) -> tuple[list[tuple[int, int]], np.ndarray]:
        """A rank on another machine than the publish slot: its rows as (offset, length) ranges of the flat
        layout and their bytes back to back, for the master relay's `piece` (which assembles the version)."""
        placed = self.placed(layout, shards)
        out = torch.empty(sum(n for _, n, _ in placed), dtype=torch.uint8)
        at = 0
        for _, n, x in placed:
            out[at : at + n].view(x.dtype).view(x.shape).copy_(x)
            at += n
        return [(start, n) for start, n, _ in placed], out.numpy()

    def _map(self, path: str, nbytes: int) -> MappedView:
        view = self._views.get(path)
        if view is None or view.nbytes < nbytes:
            if view is not None:
                self._release(path)
            view = self._views[path] = MappedView(path, nbytes, shared=True, writable=True)
            if pinning.cuda_available() and pinning.register(view.array, read_only=False):
                self._pinned.add(path)
        return view

    def _release(self, path: str) -> None:
        view = self._views.pop(path)
        if path in self._pinned:
            pinning.unregister(view.array)
            self._pinned.discard(path)
        view.close()

    def close(self) -> None:
        for path in list(self._views):
            self._release(path)
