"""Staleness, defined once: how many trainer versions a trajectory's generating policy lags the policy that
trains on it. The runtime's buffer and trainer, the run summary and the simulator all count and summarise it
here, so "p99" means the same thing everywhere (the nearest-rank percentile: the smallest lag that at least
99% of the trajectories do not exceed)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any


def staleness(trainer_version: int, generated_at: int) -> int:
    return trainer_version - generated_at


def percentile(counts: Mapping[int, int], q: float) -> int:
    """Nearest-rank percentile of a distribution given as {lag: count}; 0 when it is empty."""
    total = sum(counts.values())
    acc = 0
    for lag in sorted(counts):
        acc += counts[lag]
        if acc >= q / 100 * total:
            return lag
    return 0


def summarise(lags: Mapping[int, int] | Iterable[int]) -> dict[str, Any]:
    """mean, p50, p99, max, count and the distribution, from {lag: count} or from a list of lags."""
    counts = Counter(lags) if not isinstance(lags, Mapping) else Counter(dict(lags))
    total = sum(counts.values())
    return {
        "mean": sum(k * c for k, c in counts.items()) / total if total else 0.0,
        "p50": percentile(counts, 50),
        "p99": percentile(counts, 99),
        "max": max(counts, default=0),
        "count": total,
        "distribution": {str(k): counts[k] for k in sorted(counts)},
    }
