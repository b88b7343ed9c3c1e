"""A rollout's pull between batches: map its node relay's newest slot and load it in place.

The slot is pinned by a lease for exactly the duration of `load_fn`, so the relay cannot overwrite it mid-load;
`load_fn` (the engine's `load_weights`) must copy out of the buffer before returning, since the view dies with
the mapping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from laminar.relay.slots import MappedView

LoadFn = Callable[[np.ndarray, Any, int], None]


def pull_latest(
    relay: Any, load_fn: LoadFn, current_version: int | None, *, timeout: float = 30.0
) -> tuple[int, float] | None:
    """Load the relay's newest version if it is newer than `current_version`; returns (version, seconds)."""
    t0 = time.perf_counter()
    min_version = None if current_version is None else current_version + 1
    lease = ray.get(relay.acquire.remote(min_version), timeout=timeout)
    if lease is None:
        return None
    try:
        with MappedView(lease.path, lease.nbytes) as view:
            load_fn(view.array, lease.layout, lease.version)
    finally:
        ray.get(relay.release.remote(lease.lease_id), timeout=timeout)
    return lease.version, time.perf_counter() - t0
