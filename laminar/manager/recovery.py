"""Placing work that lost its replica (design section 6): the trajectories of a dead replica, or moves that
neither their repack destination nor their source would take back.

A group is trained only if all its samples come from one version, so placement is decided per group. If a live
replica holds the group's version, the group's homeless samples continue there, all on one replica: in-flight
ones from the tokens the partial pool holds (tokens made after their last progress report are made again,
identically, since a sampling stream depends only on its seed and position) and their tool turns (they go on after
the last turn the pool knows; a call they waited for whose result is not known runs again), never-begun ones from
their prompt.
Otherwise the whole group starts over from its prompt on one replica at that replica's version (counted), and
the buffer forgets the samples it held of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from laminar.data.partial_pool import PartialTrajectory
from laminar.data.records import PromptGroup

# A sample to place: its index in the group and what the partial pool holds of it (None: from its prompt).
Sample = tuple[int, PartialTrajectory | None]


@dataclass
class GroupWork:
    """One group with samples that need a replica, and what is known of the rest of it."""

    group: PromptGroup
    homeless: list[PartialTrajectory] = field(default_factory=list)  # in flight where they cannot go on
    unstarted: list[int] = field(default_factory=list)  # neither in flight nor in the buffer
    versions: set[int] = field(default_factory=set)  # every version any of its samples runs or ran at


@dataclass
class Placement:
    replica: int
    group: PromptGroup
    version: int
    samples: list[Sample]
    restart: bool  # the whole group from its prompt; else its homeless samples continue on their version


def choose_target(
    versions: set[int], live: dict[int, int], load: dict[int, int]
) -> tuple[int, int, bool] | None:
    """Where a group goes: (replica, version, restart). The least loaded live replica of the group's one version
    (its samples continue), else the least loaded of all (the group restarts whole at that replica's version);
    None when nothing is alive. The runtime's supervisor and the simulator both ask this."""
    version = next(iter(versions)) if len(versions) == 1 else None
    same = [r for r, v in live.items() if v == version]
    if same:
        target = min(same, key=lambda r: (load.get(r, 0), r))
        return target, live[target], False
    if live:
        target = min(live, key=lambda r: (load.get(r, 0), r))
        return target, live[target], True
    return None


def plan_recovery(work: list[GroupWork], live: dict[int, int]) -> list[Placement]:
    """`live` maps replica -> version. Each group goes to one replica (`choose_target`); groups spread by load.
    Empty when no replica is alive (the caller keeps the work)."""
    load = dict.fromkeys(live, 0)
    out = []
    for w in sorted(work, key=lambda w: w.group.group_id):
        if not w.homeless and not w.unstarted:
            continue
        chosen = choose_target(w.versions, live, load)
        if chosen is None:
            return []
        target, version, restart = chosen
        if restart:
            samples: list[Sample] = [(i, None) for i in range(w.group.n)]
        else:
            samples = [(e.sample_idx, e) for e in sorted(w.homeless, key=lambda e: e.sample_idx)]
            samples += [(i, None) for i in sorted(w.unstarted)]
        load[target] += len(samples)
        out.append(Placement(target, w.group, version, samples, restart))
    return out
