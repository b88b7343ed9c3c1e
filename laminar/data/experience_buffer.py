"""The experience buffer: scored trajectories in, complete groups out (FIFO by default), with staleness stats."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from laminar.data.records import Trajectory
from laminar.plugin import load_function

Group = list[Trajectory]
# Picks which ready groups to train on: (ready groups oldest first, how many, trainer version) -> indices.
Sampler = Callable[[list[Group], int, int], list[int]]


def fifo(ready: list[Group], count: int, version: int) -> list[int]:
    """Oldest complete groups first: the default, it keeps staleness lowest under steady load."""
    return list(range(min(count, len(ready))))


def freshest(ready: list[Group], count: int, version: int) -> list[int]:
    """Newest-version groups first (ties: oldest first); an example of a pluggable policy."""
    order = sorted(range(len(ready)), key=lambda i: (-ready[i][0].version, i))
    return order[:count]


def oldest(ready: list[Group], count: int, version: int) -> list[int]:
    """Oldest-version groups first (ties: first completed first): a long group that completes late is trained
    before newer ones that overtook it, which lowers the staleness tail at the same throughput."""
    order = sorted(range(len(ready)), key=lambda i: (ready[i][0].version, i))
    return order[:count]


SAMPLERS: dict[str, Sampler] = {"fifo": fifo, "freshest": freshest, "oldest": oldest}


def load_sampler(name: str) -> Sampler:
    """A built-in sampler by name, or `module:function` (called with the ready groups, the count wanted and the
    trainer's version; returns the indices of the groups to train on)."""
    if name in SAMPLERS:
        return SAMPLERS[name]
    if ":" not in name:
        raise ValueError(
            f"experience buffer: sampler={name!r}: expected one of {sorted(SAMPLERS)} or 'module:function'"
        )
    return load_function(name, "experience buffer: sampler", "laminar.data.experience_buffer:oldest")


class BufferFull(RuntimeError):
    """Raised by `add` under overflow='reject' when the buffer holds `capacity` trajectories."""


class ExperienceBuffer:
    """Trajectories wait in `pending` until their group has `group_size` of them, then the group joins `ready`.

    Capacity counts trajectories (pending and ready). When full, `overflow` decides: 'evict_oldest' drops the
    oldest ready group (counted in `evicted`), 'reject' raises `BufferFull` so the caller can back off (the
    manager should stop dispatching while `full()`). `max_staleness` (None = unbounded, Laminar's default)
    drops, at sampling time, ready groups older than the bound (counted in `stale_dropped`). A traj_id seen
    before is ignored and counted in `duplicates`; the buffer never hands out one trajectory twice.
    """

    def __init__(
        self,
        group_size: int,
        capacity: int = 100_000,
        max_staleness: int | None = None,
        sampler: Sampler | str = "fifo",
        overflow: str = "evict_oldest",
    ) -> None:
        if group_size < 1:
            raise ValueError(f"experience buffer: group_size={group_size}: must be >= 1")
        if capacity < group_size:
            raise ValueError(f"experience buffer: capacity={capacity} is below one group ({group_size})")
        if overflow not in ("evict_oldest", "reject"):
            raise ValueError(f"experience buffer: overflow={overflow!r}: expected 'evict_oldest' or 'reject'")
        if isinstance(sampler, str):
            sampler = load_sampler(sampler)
        self.group_size = group_size
        self.capacity = capacity
        self.max_staleness = max_staleness
        self.sampler = sampler
        self.overflow = overflow
        self.pending: dict[int, dict[int, Trajectory]] = {}
        self.ready: list[Group] = []
        self.seen: set[str] = set()
        self.staleness = Counter()
        self.counts = Counter()  # added, duplicates, evicted, stale_dropped, consumed, mixed_version_groups

    def __len__(self) -> int:
        return sum(len(g) for g in self.pending.values()) + sum(len(g) for g in self.ready)

    def held_ids(self) -> set[str]:
        """Trajectory ids held now (complete groups and partial ones)."""
        return {t.traj_id for g in self.pending.values() for t in g.values()} | {
            t.traj_id for g in self.ready for t in g
        }

    def full(self) -> bool:
        return len(self) >= self.capacity

    def add(self, traj: Trajectory) -> bool:
        """False if it was a duplicate (ignored). A group completes when all its sample indices are in."""
        if traj.traj_id in self.seen:
            self.counts["duplicates"] += 1
            return False
        if not 0 <= traj.sample_idx < self.group_size:
            raise ValueError(
                f"experience buffer: {traj.traj_id} has sample_idx {traj.sample_idx}, group size is {self.group_size}"
            )
        if self.full():
            if self.overflow == "reject" or not self.ready:
                raise BufferFull(
                    f"experience buffer holds {len(self)} trajectories (capacity {self.capacity}); "
                    f"{len(self.ready)} ready groups waiting for the trainer"
                )
            evicted = self.ready.pop(0)
            self.counts["evicted"] += 1
            self.counts["evicted_trajectories"] += len(evicted)
        self.seen.add(traj.traj_id)
        self.counts["added"] += 1
        slots = self.pending.setdefault(traj.group_id, {})
        slots[traj.sample_idx] = traj
        if len(slots) == self.group_size:
            group = [slots[i] for i in range(self.group_size)]
            del self.pending[traj.group_id]
            if len({t.version for t in group}) > 1:
                self.counts["mixed_version_groups"] += 1
            self.ready.append(group)
        return True

    def num_ready(self) -> int:
        return len(self.ready)

    def _drop_stale(self, version: int) -> None:
        if self.max_staleness is None:
            return
        keep = []
        for g in self.ready:
            if version - min(t.version for t in g) > self.max_staleness:
                self.counts["stale_dropped"] += 1
            else:
                keep.append(g)
        self.ready = keep

    def sample(self, count: int, version: int) -> list[Group] | None:
        """`count` complete groups chosen by the sampler, or None if fewer are ready; they leave the buffer."""
        self._drop_stale(version)
        if len(self.ready) < count:
            return None
        picked = self.sampler(self.ready, count, version)
        if len(set(picked)) != count or not all(0 <= i < len(self.ready) for i in picked):
            raise RuntimeError(
                f"experience buffer: sampler returned {picked} for {count} of {len(self.ready)} groups"
            )
        chosen = set(picked)
        out = [self.ready[i] for i in picked]
        self.ready = [g for i, g in enumerate(self.ready) if i not in chosen]
        for g in out:
            for t in g:
                self.staleness[version - t.version] += 1
        self.counts["consumed"] += sum(len(g) for g in out)
        return out

    def staleness_stats(self) -> dict[str, float]:
        """Distribution of (consumer version - generator version) over everything sampled so far."""
        total = sum(self.staleness.values())
        if total == 0:
            return {"mean": 0.0, "p99": 0.0, "max": 0.0, "count": 0}
        values = sorted(self.staleness)
        mean = sum(k * c for k, c in self.staleness.items()) / total
        acc, p99 = 0, values[-1]
        for k in values:
            acc += self.staleness[k]
            if acc >= 0.99 * total:
                p99 = k
                break
        return {"mean": mean, "p99": float(p99), "max": float(values[-1]), "count": total}

    def stats(self) -> dict[str, Any]:
        return {
            "size": len(self),
            "ready_groups": len(self.ready),
            "pending_groups": len(self.pending),
            **{k: int(v) for k, v in self.counts.items()},
            "staleness": self.staleness_stats(),
            "staleness_hist": dict(sorted(self.staleness.items())),
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume without losing or duplicating a trajectory (the sampler is code, not state)."""
        return copy.deepcopy(
            {
                "pending": {gid: [asdict(t) for t in slots.values()] for gid, slots in self.pending.items()},
                "ready": [[asdict(t) for t in g] for g in self.ready],
                "seen": sorted(self.seen),
                "staleness": dict(self.staleness),
                "counts": dict(self.counts),
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = copy.deepcopy(state)
        self.pending = {
            int(gid): {t["sample_idx"]: Trajectory(**t) for t in trajs}
            for gid, trajs in state["pending"].items()
        }
        self.ready = [[Trajectory(**t) for t in g] for g in state["ready"]]
        self.seen = set(state["seen"])
        self.staleness = Counter({int(k): v for k, v in state["staleness"].items()})
        self.counts = Counter(state["counts"])
