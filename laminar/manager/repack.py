"""The dynamic repack planner (design section 5): a pure function from replica snapshots to moves.

Replicas in their ramp-down tail run a handful of long trajectories and waste their GPU. Packing those
trajectories onto fewer replicas of the same weight version frees the rest to pull fresh weights and take new
prompts. The planner only decides; the manager moves requests with the engine's export/import. Both the
runtime manager and the simulator call it, so what the simulator predicts is what the runtime does.

A request drafts its speculative tokens from the text of its group's requests on the same replica, so the
planner keeps the requests of one group on one destination where that costs nothing (`plan_repack`).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from laminar.data.records import group_of

if TYPE_CHECKING:
    from laminar.config import RepackConfig


@dataclass(frozen=True)
class ReplicaLoad:
    """A snapshot the manager takes of one replica; `requests` are its running (request_id, kv_blocks)."""

    replica: int
    version: int
    waiting: int
    running: int
    kv_blocks_used: int
    kv_blocks_total: int
    peak_kv_blocks: int
    requests: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Move:
    request_id: str
    source: int
    destination: int


@dataclass(frozen=True)
class RepackPlan:
    """Moves to make and replicas they release; every request of a released replica has a move."""

    moves: tuple[Move, ...] = ()
    released: tuple[int, ...] = ()


def split_groups(loads: Iterable[ReplicaLoad], plan: RepackPlan) -> int:
    """Groups whose requests are on more than one replica once the plan's moves are made: each such request
    drafts only from the part of its group its replica holds."""
    where = {rid: r.replica for r in loads for rid, _ in r.requests}
    for m in plan.moves:
        where[m.request_id] = m.destination
    replicas: dict[str, set[int]] = defaultdict(set)
    for rid, replica in where.items():
        group = group_of(rid)
        if group is not None:
            replicas[group].add(replica)
    return sum(len(s) > 1 for s in replicas.values())


def idle_replicas(
    loads: Iterable[ReplicaLoad], batch_limit_b: int, ramp_down_frac: float = 1.0
) -> list[ReplicaLoad]:
    """Replicas in their ramp-down tail: nothing waiting, KV below `ramp_down_frac` of their own peak (1.0: any
    drop; 0.5: half the batch's KV freed), fewer than B running.

    A replica with nothing running is already free (it pulls and takes prompts by itself), so it is not a
    candidate: it would only be a destination, and filling it with old-version work would keep it from the
    newest weights.
    """
    return [
        r
        for r in loads
        if r.waiting == 0
        and r.running > 0
        and r.kv_blocks_used < ramp_down_frac * r.peak_kv_blocks
        and r.running < batch_limit_b
    ]


@dataclass
class _Bin:
    """Mutable planning state of one replica."""

    replica: int
    kv: int
    running: int
    kv_max: float
    requests: tuple[tuple[str, int], ...]
    released: bool = False
    received: bool = False
    groups: Counter[int | str] = field(default_factory=Counter)  # requests it holds of each group


Choose = Callable[[list[_Bin], int, int], "_Bin | None"]


def _best_fit(candidates: list[_Bin], blocks: int, batch_limit_b: int) -> _Bin | None:
    """The fullest destination that still fits, so the emptiest replicas are left to release."""
    best, best_key = None, None
    for b in candidates:  # a plain loop: this is the planner's hot path
        if b.released or b.running >= batch_limit_b or b.kv + blocks > b.kv_max:
            continue
        key = (b.kv, b.running, -b.replica)
        if best_key is None or key > best_key:
            best, best_key = b, key
    return best


def _best_fit_relative(candidates: list[_Bin], blocks: int, batch_limit_b: int) -> _Bin | None:
    """Fullest by fraction of its own limits: what matters when replicas differ in KV size."""
    best, best_key = None, None
    for b in candidates:
        if b.released or b.running >= batch_limit_b or b.kv + blocks > b.kv_max:
            continue
        key = (max(b.kv / b.kv_max, b.running / batch_limit_b), -b.replica)
        if best_key is None or key > best_key:
            best, best_key = b, key
    return best


def _first_fit(candidates: list[_Bin], blocks: int, batch_limit_b: int) -> _Bin | None:
    for b in candidates:
        if not b.released and b.running < batch_limit_b and b.kv + blocks <= b.kv_max:
            return b
    return None


Trial = list[tuple[str, int, _Bin]]


def _put(trial: Trial, request_id: str, blocks: int, dest: _Bin) -> None:
    dest.kv += blocks
    dest.running += 1
    group = group_of(request_id)
    if group is not None:
        dest.groups[group] += 1
    trial.append((request_id, blocks, dest))


def _undo(trial: Trial) -> None:
    for request_id, blocks, dest in trial:
        dest.kv -= blocks
        dest.running -= 1
        group = group_of(request_id)
        if group is not None:
            dest.groups[group] -= 1


def _place_each(reqs: list[tuple[str, int]], others: list[_Bin], choose: Choose, batch_limit_b: int) -> Trial:
    """Each request on its own, in order; stops at the first that fits nowhere."""
    trial: Trial = []
    for request_id, blocks in reqs:
        dest = choose(others, blocks, batch_limit_b)
        if dest is None:
            break
        _put(trial, request_id, blocks, dest)
    return trial


def _place_groups(
    reqs: list[tuple[str, int]], others: list[_Bin], choose: Choose, batch_limit_b: int
) -> Trial:
    """Each group of the source whole on one destination, the largest group first: among those that fit it,
    one that holds most of its siblings already, else the one `choose` picks for the group's blocks. A group
    that fits on no one destination is placed request by request, as without groups."""
    # by group, else by the request's own id
    units: dict[int | str, list[tuple[str, int]]] = defaultdict(list)
    for request_id, blocks in reqs:
        group = group_of(request_id)
        units[request_id if group is None else group].append((request_id, blocks))
    trial: Trial = []
    # the largest first; on a tie by the id's text (its group's digits), so the order never depends on the key type
    for group, members in sorted(units.items(), key=lambda u: (-sum(b for _, b in u[1]), str(u[0]))):
        n, need = len(members), sum(b for _, b in members)
        fits = [b for b in others if b.running + n <= batch_limit_b and b.kv + need <= b.kv_max]
        most = max((b.groups[group] for b in fits), default=0)
        dest = choose([b for b in fits if b.groups[group] == most], need, batch_limit_b) if fits else None
        if dest is not None:
            for request_id, blocks in members:
                _put(trial, request_id, blocks, dest)
            continue
        placed = _place_each(members, others, choose, batch_limit_b)
        trial += placed
        if len(placed) < n:
            break
    return trial


def _pack_group(
    bins: list[_Bin],
    order: Sequence[_Bin],
    choose: Choose,
    batch_limit_b: int,
    largest_first: bool,
    max_released: int,
    keep_groups: bool = False,
) -> list[Move]:
    """Try to empty each source in `order` onto the others; keep a source's moves only if all of them fit.

    Free sequence slots and KV room summed over the other replicas bound what a source can shed, which
    skips most hopeless sources without a trial (the simulator calls this for hundreds of replicas).
    With `keep_groups` a source's groups are placed whole first (`_place_groups`), and only if that fails
    request by request, so a source that empties without groups still empties.
    """
    moves: list[Move] = []
    slots = sum(batch_limit_b - b.running for b in bins)
    room = sum(max(0.0, b.kv_max - b.kv) for b in bins)
    released = 0
    for source in order:
        if released >= max_released:
            break
        if source.received or source.released:
            continue
        own_slots, own_room = batch_limit_b - source.running, max(0.0, source.kv_max - source.kv)
        need = sum(blocks for _, blocks in source.requests)
        if len(source.requests) > slots - own_slots or need > room - own_room:
            continue
        others = [b for b in bins if b is not source and not b.released and b.running < batch_limit_b]
        reqs = (
            sorted(source.requests, key=lambda r: (-r[1], r[0])) if largest_first else list(source.requests)
        )
        trial: Trial = []
        if keep_groups:
            trial = _place_groups(reqs, others, choose, batch_limit_b)
            if len(trial) < len(reqs):
                _undo(trial)
                trial = []
        if not trial:
            trial = _place_each(reqs, others, choose, batch_limit_b)
        if len(trial) == len(reqs):
            source.released = True
            released += 1
            slots -= own_slots + len(reqs)
            room -= own_room + need
            for request_id, _, dest in trial:
                dest.received = True
                moves.append(Move(request_id, source.replica, dest.replica))
        else:
            _undo(trial)
    return moves


def _bins(group: Sequence[ReplicaLoad], kv_capacity_frac: float) -> list[_Bin]:
    return [
        _Bin(
            r.replica,
            r.kv_blocks_used,
            r.running,
            kv_capacity_frac * r.kv_blocks_total,
            r.requests,
            groups=Counter(g for rid, _ in r.requests if (g := group_of(rid)) is not None),
        )
        for r in group
    ]


def _plan(
    loads: Iterable[ReplicaLoad],
    batch_limit_b: int,
    kv_capacity_frac: float,
    choose: Choose,
    sort_sources: bool,
    largest_first: bool,
    max_released: int | None,
    newest_first: bool = False,
    min_version: int | None = None,
    ramp_down_frac: float = 1.0,
    keep_groups: bool = False,
) -> RepackPlan:
    if batch_limit_b < 1:
        raise ValueError(f"batch_limit_b={batch_limit_b} must be >= 1")
    if not 0.0 < kv_capacity_frac <= 1.0:
        raise ValueError(f"kv_capacity_frac={kv_capacity_frac} must be in (0, 1]")
    if max_released is not None and max_released < 0:
        raise ValueError(f"max_released={max_released} must be >= 0 (or None for no limit)")
    budget = len(list(loads)) if max_released is None else max_released
    groups: dict[int, list[ReplicaLoad]] = defaultdict(list)
    if not 0.0 < ramp_down_frac <= 1.0:
        raise ValueError(f"ramp_down_frac={ramp_down_frac} must be in (0, 1]")
    for r in sorted(idle_replicas(loads, batch_limit_b, ramp_down_frac), key=lambda r: r.replica):
        if min_version is None or r.version >= min_version:
            groups[r.version].append(r)
    moves: list[Move] = []
    released: list[int] = []
    for version in sorted(groups, reverse=newest_first):
        if len(groups[version]) < 2 or len(released) >= budget:
            continue
        bins = _bins(groups[version], kv_capacity_frac)
        order = sorted(bins, key=lambda b: (b.kv, b.running, b.replica)) if sort_sources else bins
        moves += _pack_group(
            bins, order, choose, batch_limit_b, largest_first, budget - len(released), keep_groups
        )
        released += [b.replica for b in bins if b.released]
    return RepackPlan(tuple(moves), tuple(sorted(released)))


def plan_with(
    policy: RepackConfig,
    loads: Iterable[ReplicaLoad],
    *,
    trainer_version: int,
    max_released: int | None = None,
    batch_limit_b: int = 0,
) -> RepackPlan:
    """The plan the run's repack policy makes (the `repack` config section, whole): the one place its knobs
    become `plan_repack`'s arguments, for the manager's loop and the simulator alike. `max_age` leaves replicas
    that many versions behind `trainer_version` alone (the staleness tail: packing it would slow it further);
    `batch_limit_b` overrides the policy's B (the simulator's, from its cost model)."""
    age = policy.max_age
    return plan_repack(
        loads,
        batch_limit_b=batch_limit_b or policy.batch_limit_b,
        kv_capacity_frac=policy.kv_capacity,
        max_released=max_released,
        newest_first=policy.newest_first,
        min_version=None if age is None else trainer_version - age + 1,
        capped_batch_limit_b=policy.capped_batch_limit_b,
        ramp_down_frac=policy.ramp_down_frac,
    )


def plan_repack(
    loads: Iterable[ReplicaLoad],
    *,
    batch_limit_b: int,
    kv_capacity_frac: float = 0.9,
    max_released: int | None = None,
    newest_first: bool = False,
    min_version: int | None = None,
    capped_batch_limit_b: int = 0,
    ramp_down_frac: float = 1.0,
    keep_groups: bool = True,
) -> RepackPlan:
    """Best-fit repack inside each weight-version group, maximising the replicas released.

    Sources go in ascending KV footprint (the cheapest to empty first) and each trajectory, largest first,
    goes to the fullest destination within C_max = kv_capacity_frac * its KV blocks and B running. A replica
    that received work is never released later. Deterministic: ties break on replica id and request id.

    Best fit is not always optimal with two limits (KV and running count) and unequal replicas, so the
    planner also tries best fit on relative load and plain first fit and keeps the plan that releases the
    most replicas (then the fewest moves; then the first tried).

    `max_released` caps the replicas freed (the manager passes how many it has prompts for): packing slows
    the packed tails, which pays only when a freed GPU has new work. The newest versions' groups go last,
    so the cap is spent on the oldest trajectories first; with `newest_first` they go first instead, so the
    oldest trajectories, the staleness tail, keep running alone at their fastest. Replicas running a version
    older than `min_version` are left alone (neither source nor destination).

    `capped_batch_limit_b` (0 = B): the running limit when `max_released` caps the round below the replicas
    it could free, i.e. when the dispatch bound, not the rollouts, limits the work: then the few freed
    replicas gain little and every packed tail slows, so tails are packed only this far.

    `ramp_down_frac` (1.0 = any drop): a replica is a source only once its KV has fallen below this share of
    its batch's peak. With small batches far below B, every replica qualifies as soon as its first request
    finishes, and a group moved that early pays the move for most of its life.

    `keep_groups`: a request drafts its speculative tokens only from the part of its group (the requests of
    one prompt, `laminar.data.records.group_of`) that its replica holds, so the planner also plans each source's groups
    whole, onto a destination that holds their siblings where one fits, and takes that plan when it leaves
    fewer groups split (`split_groups`) while releasing as many replicas with no more moves and no more KV
    blocks moved; else it keeps the plan without groups. It is on whatever `rollout.speculation` says: the
    plan is never worse by what repack is judged on (replicas freed, requests and tokens moved, C_max, B),
    and the planner's time at most doubles, only in rounds whose plan would leave a group split.
    `keep_groups=False` gives the plan without groups, to compare.
    """
    loads = list(loads)
    if capped_batch_limit_b and max_released is not None:
        if max_released < len(idle_replicas(loads, batch_limit_b, ramp_down_frac)):
            batch_limit_b = min(batch_limit_b, capped_batch_limit_b)
    args = (loads, batch_limit_b, kv_capacity_frac)
    order = {
        "max_released": max_released,
        "newest_first": newest_first,
        "min_version": min_version,
        "ramp_down_frac": ramp_down_frac,
    }

    def best(grouped: bool) -> RepackPlan:
        kw = {**order, "keep_groups": grouped}
        plans = [_plan(*args, _best_fit, sort_sources=True, largest_first=True, **kw)]
        if max_released is not None and len(plans[0].released) >= max_released:
            return plans[0]  # nothing can release more
        plans.append(_plan(*args, _best_fit_relative, sort_sources=True, largest_first=True, **kw))
        plans.append(_plan(*args, _first_fit, sort_sources=False, largest_first=False, **kw))
        return max(plans, key=lambda p: (len(p.released), -len(p.moves)))

    plan = best(False)
    if not keep_groups or not plan.moves or (split := split_groups(loads, plan)) == 0:
        return plan
    grouped = best(True)
    if (
        len(grouped.released) >= len(plan.released)
        and len(grouped.moves) <= len(plan.moves)
        and _blocks(loads, grouped) <= _blocks(loads, plan)
        and split_groups(loads, grouped) < split
    ):
        return grouped
    return plan


def _blocks(loads: Sequence[ReplicaLoad], plan: RepackPlan) -> int:
    """KV blocks the plan moves: the tokens it sends (or prefills again)."""
    blocks = {rid: b for r in loads for rid, b in r.requests}
    return sum(blocks[m.request_id] for m in plan.moves)


def plan_first_fit(
    loads: Iterable[ReplicaLoad], *, batch_limit_b: int, kv_capacity_frac: float = 0.9
) -> RepackPlan:
    """The simple baseline: sources by replica id, each request to the first replica that fits."""
    return _plan(
        loads,
        batch_limit_b,
        kv_capacity_frac,
        _first_fit,
        sort_sources=False,
        largest_first=False,
        max_released=None,
    )
