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
from typing import Any

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


def engine_items(p: Placement, sampling: dict[str, Any], run_seed: int, now: float) -> list[tuple[Any, Any]]:
    """A placement as the engine imports it: each sample with its own sampling stream (seeded by its id, so it
    continues exactly), its tokens so far with their loss mask, its tool state (parked on its call if it waited
    for one), and the replica-side record of it."""
    from laminar.engine import ExportedRequest, SamplingParams
    from laminar.rollout.inflight import InFlight, sample_seed
    from laminar.tools.turns import TurnState

    g, v, items = p.group, p.version, []
    for idx, e in p.samples:
        tid = g.traj_id(idx)
        tokens, logprobs = (list(e.response_ids), list(e.logprobs)) if e is not None else ([], [])
        mask = list(e.loss_mask) if e is not None and len(e.loss_mask) == len(tokens) else []
        tool = TurnState.of(e.tool) if e is not None and e.tool is not None else None
        params = SamplingParams(seed=sample_seed(run_seed, tid), **{**sampling, **g.meta.get("sampling", {})})
        exported = ExportedRequest(
            tid,
            list(g.prompt_ids),
            tokens,
            logprobs,
            [v] * len(tokens),
            params,
            v,
            loss_mask=mask,
            parked=tool is not None and tool.parked,
        )
        state = InFlight(g, idx, v, now, list(tokens), list(logprobs), reported=len(tokens), tool=tool)
        items.append((exported, state))
    return items


def lost_calls(items: list[tuple[Any, Any]]) -> int:
    """Tool calls these recovered samples waited for whose result was lost: their new replica runs them again."""
    return sum(s.tool is not None and s.tool.parked and s.tool.result is None for _, s in items)
