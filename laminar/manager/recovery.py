"""Placing work that lost its replica (design section 6): the trajectories of a dead replica, or moves that
neither their repack destination nor their source would take back.

A group is trained only if all its samples come from one version, so placement is decided per group. If a live
replica holds the group's version, the group's homeless samples continue there, all on one replica: in-flight
ones from the tokens the partial pool holds (tokens made after their last progress report are made again,
identically, since a sampling stream depends only on its seed and position), never-begun ones from their prompt.
Otherwise the whole group starts over from its prompt on one replica at that replica's version (counted), and
the buffer forgets the samples it held of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from laminar.data.partial_pool import PartialTrajectory
from laminar.data.records import PromptGroup
from laminar.engine import ExportedRequest, SamplingParams
from laminar.rollout.replica import InFlight, sample_seed

Item = tuple[ExportedRequest, InFlight]


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
    items: list[Item]
    restart: bool  # the whole group from its prompt; else its homeless samples continue on their version


def _item(
    group: PromptGroup,
    idx: int,
    version: int,
    tokens: list[int],
    logprobs: list[float],
    sampling: dict[str, Any],
    run_seed: int,
    now: float,
) -> Item:
    tid = group.traj_id(idx)
    params = SamplingParams(seed=sample_seed(run_seed, tid), **{**sampling, **group.meta.get("sampling", {})})
    exported = ExportedRequest(
        tid, list(group.prompt_ids), list(tokens), list(logprobs), [version] * len(tokens), params, version
    )
    state = InFlight(group, idx, version, now, list(tokens), list(logprobs), reported=len(tokens))
    return exported, state


def plan_recovery(
    work: list[GroupWork], live: dict[int, int], sampling: dict[str, Any], run_seed: int, now: float
) -> list[Placement]:
    """`live` maps replica -> version. Each group goes to one replica: the least loaded of its version, or
    (restart) the least loaded of all. Empty when no replica is alive (the caller keeps the work)."""
    load = dict.fromkeys(live, 0)
    out = []
    for w in sorted(work, key=lambda w: w.group.group_id):
        if not w.homeless and not w.unstarted:
            continue
        version = next(iter(w.versions)) if len(w.versions) == 1 else None
        same = [r for r, v in live.items() if v == version]
        g = w.group
        if same:
            target = min(same, key=lambda r: (load[r], r))
            items = [
                _item(g, e.sample_idx, version, e.response_ids, e.logprobs, sampling, run_seed, now)
                for e in sorted(w.homeless, key=lambda e: e.sample_idx)
            ]
            items += [_item(g, i, version, [], [], sampling, run_seed, now) for i in sorted(w.unstarted)]
            restart = False
        elif live:
            target = min(live, key=lambda r: (load[r], r))
            version = live[target]
            items = [_item(g, i, version, [], [], sampling, run_seed, now) for i in range(g.n)]
            restart = True
        else:
            return []
        load[target] += len(items)
        out.append(Placement(target, g, version, items, restart))
    return out
