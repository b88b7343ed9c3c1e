"""A rollout's pull between batches: map its node relay's newest slot and load it in place.

The slot is pinned by a lease for exactly the duration of `load_fn`, so the relay cannot overwrite it mid-load;
`load_fn` (the engine's `load_weights`) must copy out of the buffer before returning.

`pull_slot` holds the lease around a function given the slot's file (a tensor-parallel replica's ranks each map
it and copy their own slices); `pull_latest` maps the slot for one pull. `SlotReader` keeps the relay's few slots
mapped across pulls and, when the engine is on a GPU, registered with CUDA: a registered buffer copies to the GPU
at PCIe speed, a pageable one at a fraction of it (measured on an H200 host, 200 MB: 7.5 GB/s pageable, 53 GB/s
registered, 12 ms to register once; results/relay/gpu_pin_probe.json).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from laminar.relay import pinning
from laminar.relay.slots import MappedView

LoadFn = Callable[[np.ndarray, Any, int], None]
# load a slot by its file: (path, nbytes, layout, version); a tensor-parallel replica's ranks each map it
SlotFn = Callable[[str, int, Any, int], None]


def pull_slot(
    relay: Any, load_slot: SlotFn, current_version: int | None, *, timeout: float = 30.0
) -> tuple[int, float] | None:
    """Lease the relay's newest slot if it holds a version newer than `current_version` and hand its file to
    `load_slot`, holding the lease until it returns; returns (version, seconds)."""
    t0 = time.perf_counter()
    min_version = None if current_version is None else current_version + 1
    lease = ray.get(relay.acquire.remote(min_version), timeout=timeout)
    if lease is None:
        return None
    try:
        load_slot(lease.path, lease.nbytes, lease.layout, lease.version)
    finally:
        ray.get(relay.release.remote(lease.lease_id), timeout=timeout)
    return lease.version, time.perf_counter() - t0


def pull_latest(
    relay: Any, load_fn: LoadFn, current_version: int | None, *, timeout: float = 30.0
) -> tuple[int, float] | None:
    """Load the relay's newest version if it is newer than `current_version`; returns (version, seconds)."""

    def load(path: str, nbytes: int, layout: Any, version: int) -> None:
        with MappedView(path, nbytes) as view:
            load_fn(view.array, layout, version)

    return pull_slot(relay, load, current_version, timeout=timeout)


class SlotReader:
    """One rollout's reader of its node relay, keeping mappings (and CUDA registrations) across pulls. `relay`
    may be None for a reader that is only handed slot files (`load`): a tensor-parallel replica's other ranks."""

    def __init__(self, relay: Any, *, pin: bool | None = None, timeout: float = 30.0, max_maps: int = 8):
        self.relay = relay
        self.timeout = timeout
        if pin and not pinning.cuda_available():
            raise ValueError(
                "pin=True registers slots with CUDA, but CUDA is not available here; use pin=None"
            )
        self._pin = pinning.cuda_available() if pin is None else pin
        self._max_maps = max_maps
        self._maps: dict[str, tuple[MappedView, bool]] = {}  # path -> (view, registered)

    def set_relay(self, relay: Any) -> None:
        """A new relay has new slot files: drop the old mappings."""
        self.close()
        self.relay = relay

    def pull(self, load_fn: LoadFn, current_version: int | None) -> tuple[int, float] | None:
        """Like `pull_latest`, through the kept mappings; returns (version, seconds) or None."""
        return pull_slot(
            self.relay,
            lambda path, nbytes, layout, version: self.load(load_fn, path, nbytes, layout, version),
            current_version,
            timeout=self.timeout,
        )

    def load(self, load_fn: LoadFn, path: str, nbytes: int, layout: Any, version: int) -> None:
        """`load_fn` over the slot file `path`, mapped (and registered) once and kept."""
        view = self._view(path, nbytes)
        with warnings.catch_warnings():  # the shared mapping is read-only; load_fn only reads it
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            load_fn(view.array[:nbytes], layout, version)

    def _view(self, path: str, nbytes: int) -> MappedView:
        kept = self._maps.get(path)
        if kept is not None and kept[0].nbytes >= nbytes:
            return kept[0]
        if kept is not None:
            self._drop(path)
        while len(self._maps) >= self._max_maps:
            self._drop(next(iter(self._maps)))
        view = MappedView(path, nbytes, shared=True)
        self._maps[path] = (view, self._pin and pinning.register(view.array, read_only=True))
        return view

    def _drop(self, path: str) -> None:
        view, registered = self._maps.pop(path)
        if registered:
            pinning.unregister(view.array)
        view.close()

    def close(self) -> None:
        for path in list(self._maps):
            self._drop(path)
