"""The experience buffer: scored trajectories in, complete groups out (FIFO by default), with staleness stats."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from laminar.data.records import Trajectory
from laminar.data.staleness import staleness, summarise
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


class ExperienceBuffer:
    """Trajectories wait in `pending` until their group has `group_size` of them, then the group joins `ready`.

    A group's samples all come from one version, by construction: a sample of a newer version than its group's
    pending ones supersedes them (the group was issued again, e.g. after a resume, and all its samples are being
    made again), an older one is ignored, and after `restart_group` only the named version is taken.

    Capacity counts trajectories (pending and ready); when full, the oldest ready group is evicted.
    `max_staleness` (None = unbounded, Laminar's default) drops, at sampling time, ready groups older than the
    bound. Every id dropped is kept in `dropped` with its reason (evicted, stale) for the audit.
    A traj_id seen before is ignored and counted in `duplicates`; the buffer never hands out one trajectory
    twice.
    """

    def __init__(
        self,
        group_size: int,
        capacity: int = 100_000,
        max_staleness: int | None = None,
        sampler: Sampler | str = "fifo",
    ) -> None:
        if group_size < 1:
            raise ValueError(f"experience buffer: group_size={group_size}: must be >= 1")
        if capacity < group_size:
            raise ValueError(f"experience buffer: capacity={capacity} is below one group ({group_size})")
        if isinstance(sampler, str):
            sampler = load_sampler(sampler)
        self.group_size = group_size
        self.capacity = capacity
        self.max_staleness = max_staleness
        self.sampler = sampler
        self.pending: dict[int, dict[int, Trajectory]] = {}
        self.ready: list[Group] = []
        self.seen: set[str] = set()
        self.required: dict[int, int] = {}  # group -> the one version it is taken at (set by `restart_group`)
        self.dropped: dict[str, str] = {}  # traj_id -> why it will never be trained
        self.staleness = Counter()
        self.counts = Counter()  # added, duplicates, superseded, evicted, stale_dropped, consumed

    def __len__(self) -> int:
        return sum(len(g) for g in self.pending.values()) + sum(len(g) for g in self.ready)

    def held_ids(self) -> set[str]:
        """Trajectory ids held now (complete groups and partial ones)."""
        return {t.traj_id for g in self.pending.values() for t in g.values()} | {
            t.traj_id for g in self.ready for t in g
        }

    def full(self) -> bool:
        return len(self) >= self.capacity

    def _drop(self, group: Group, reason: str) -> None:
        for t in group:
            self.dropped[t.traj_id] = reason

    def _forget_pending(self, group_id: int) -> None:
        """Its samples will be made again: they leave, and their ids may come back."""
        for t in self.pending.pop(group_id, {}).values():
            self.seen.discard(t.traj_id)
            self.counts["superseded"] += 1

    def add(self, traj: Trajectory) -> bool:
        """False if it was ignored (a duplicate, or a version its group is no longer taken at). A group
        completes when all its sample indices are in."""
        gid = traj.group_id
        slots = self.pending.get(gid)
        if gid in self.required:
            if traj.version != self.required[gid]:
                self.counts["superseded"] += 1
                return False
        elif slots:
            held = next(iter(slots.values())).version
            if traj.version < held:
                self.counts["superseded"] += 1
                return False
            if traj.version > held:
                self._forget_pending(gid)
        if traj.traj_id in self.seen:
            self.counts["duplicates"] += 1
            return False
        if not 0 <= traj.sample_idx < self.group_size:
            raise ValueError(
                f"experience buffer: {traj.traj_id} has sample_idx {traj.sample_idx}, group size is {self.group_size}"
            )
        if self.full():
            if not self.ready:
                raise RuntimeError(
                    f"experience buffer holds {len(self)} trajectories (capacity {self.capacity}) and no "
                    "complete group to evict"
                )
            evicted = self.ready.pop(0)
            self._drop(evicted, "evicted")
            self.counts["evicted"] += 1
            self.counts["evicted_trajectories"] += len(evicted)
        self.seen.add(traj.traj_id)
        self.counts["added"] += 1
        slots = self.pending.setdefault(gid, {})
        slots[traj.sample_idx] = traj
        if len(slots) == self.group_size:
            group = [slots[i] for i in range(self.group_size)]
            del self.pending[gid]
            self.required.pop(gid, None)
            self.ready.append(group)
        return True

    def restart_group(self, group_id: int, traj_ids: list[str], version: int) -> bool:
        """Recovery starts the whole group over at `version`: its samples held now go, and only samples of
        `version` are taken for it from now on. False (nothing changes) if the group is already complete. Asked
        again for the same version (a call retried after the buffer's process was lost), what it holds of that
        version stays."""
        held = self.pending.get(group_id, {}).values()
        if self.required.get(group_id) == version and all(t.version == version for t in held):
            return True
        if group_id not in self.pending and all(t in self.seen for t in traj_ids):
            return False
        self._forget_pending(group_id)
        self.required[group_id] = version
        return True

    def resumed(self) -> int:
        """After a restore: every group not complete is issued again whole, at the resumed run's versions, so no
        group may still be held to the version a recovery restarted it at (its samples would all be refused:
        the group lost). The newest version wins as for any group. Returns how many constraints went."""
        n = len(self.required)
        self.required.clear()
        return n

    def group_state(self, group_id: int, traj_ids: list[str]) -> tuple[list[str], set[int]]:
        """Which of a group's ids the buffer has (or had), and the versions of those it holds now."""
        held = self.pending.get(group_id, {})
        return [t for t in traj_ids if t in self.seen], {t.version for t in held.values()}

    def num_ready(self) -> int:
        return len(self.ready)

    def _drop_stale(self, version: int) -> None:
        if self.max_staleness is None:
            return
        keep = []
        for g in self.ready:
            if version - min(t.version for t in g) > self.max_staleness:
                self._drop(g, "stale")
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
                self.staleness[staleness(version, t.version)] += 1
        self.counts["consumed"] += sum(len(g) for g in out)
        return out

    def staleness_stats(self) -> dict[str, Any]:
        """Distribution of (consumer version - generator version) over everything sampled so far."""
        return summarise(self.staleness)

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
                "required": dict(self.required),
                "dropped": dict(self.dropped),
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
        self.required = {int(g): v for g, v in state.get("required", {}).items()}
        self.dropped = dict(state.get("dropped", {}))
        self.staleness = Counter({int(k): v for k, v in state["staleness"].items()})
        self.counts = Counter(state["counts"])
