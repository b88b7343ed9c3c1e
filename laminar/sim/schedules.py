"""The schedules on the simulated cluster, as the runtime runs them.

Every schedule but `verl` is the runtime's own value and loop: `schedule_of` writes the runtime `Config` the
simulated run stands for and builds its `Schedule` with `Schedule.from_config`, the very function `laminar train`
calls; `RuntimeLoop` runs it as the runtime does (`laminar.rollout.replica` and `Schedule.run`): a replica whose
batch has drained pulls the newest version its relay holds, then asks for prompt groups, and the answer is the
schedule's dispatch rule (`laminar.schedules.dispatch`). What differs between schedules is only that value: the rule,
whether the trainer takes its batches in dispatch order, whether a new version is a global push, whether it
interrupts generation, and whether long tails are repacked. Laminar's ablations are the runtime's overrides of
`laminar` (`ABLATIONS`); `verl` (sync with trainer and rollouts colocated on every GPU, switching costs instead
of a broadcast) is the simulator's own.

A global push (the baselines): the trainer stalls until every rollout machine holds the new version
(`CostModel.global_broadcast_s`; our runtime's baselines wait for every relay, and the paper's baseline systems
broadcast GPU to GPU) and the rollouts load it between batches. Laminar's trainer stalls only for the publish
(`publish_s`); the version reaches each machine's relay along the chain (`relay_arrival_s`) and each rollout pays
a pull (`pull_s`) when it adopts it.
"""

from __future__ import annotations

import math
from dataclasses import replace

from laminar.configure import load_config
from laminar.data.records import traj_id
from laminar.manager.recovery import choose_target
from laminar.manager.repack import ReplicaLoad, plan_with, split_groups
from laminar.schedules.schedule import Schedule
from laminar.sim.cluster import Cluster
from laminar.sim.config import ABLATIONS
from laminar.sim.replica import Group, Replica, Traj


def replica_groups(cluster: Cluster, ahead_batches: float) -> int:
    """Groups a replica takes at once (`rollout.groups_per_batch`): enough to fill it, but no more than its
    share of what may be outstanding (at 1024 GPUs a global batch covers only a few sequences a replica)."""
    cfg = cluster.cfg
    fill = max(1, int(cfg.replica_fill * cluster.cost.max_num_seqs / cfg.group_size))
    share = math.ceil(ahead_batches * cfg.groups_per_step / max(1, len(cluster.live())))
    return max(1, min(fill, share))


def schedule_of(cluster: Cluster) -> Schedule:
    """The runtime's schedule for the simulated run: the config the run stands for, built as `laminar train`
    builds it. A replica's share of what may be outstanding: `max_ahead_batches` global batches
    (`buffer.capacity_groups`), and for stream / partial the k + 1 batches their bound allows."""
    cfg, g = cluster.cfg, cluster.cfg.groups_per_step
    ablation = ABLATIONS.get(cfg.schedule.name, ())
    name = "laminar" if ablation else cfg.schedule.name
    ahead_batches = cfg.schedule.staleness + 1 if name in ("stream", "partial") else cfg.max_ahead_batches
    run = load_config(None, list(ablation))  # an ablation's overrides, as `laminar bench schedules` has them
    run.schedule = replace(
        cfg.schedule, name=name, global_push=cfg.schedule.global_push or run.schedule.global_push
    )
    run.trainer.groups_per_step = g
    run.rollout.replicas = max(1, len(cluster.live()))
    run.rollout.groups_per_batch = replica_groups(cluster, ahead_batches)
    run.buffer.capacity_groups = int(cfg.max_ahead_batches * g)
    run.repack = replace(cfg.repack, enabled=cfg.repack.enabled and run.repack.enabled)
    return Schedule.from_config(run)


class Base:
    """Default hooks: do nothing."""

    in_order = False

    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster
        self.cfg = cluster.cfg

    def start(self) -> None: ...
    def on_traj_done(self, traj: Traj, replica: Replica) -> None: ...
    def on_group_done(self, group: Group) -> None: ...
    def on_drained(self, replica: Replica) -> None: ...
    def on_trained(self, version: int) -> None: ...

    def on_failure(self, machine: int) -> None:
        self.c.global_restart()


class Verl(Base):
    """Colocated: every GPU generates a batch, then every GPU trains; each phase switch offloads and
    reloads. The batch is spread evenly over the replicas."""

    def start(self) -> None:
        self.left = self.cfg.groups_per_step
        live = self.c.live()
        g = self.cfg.groups_per_step
        for i, r in enumerate(live):
            self.c.dispatch(r, g // len(live) + (i < g % len(live)))

    def on_group_done(self, group: Group) -> None:
        self.left -= 1
        if self.left == 0:
            self.c.trainer_stall(self.c.cost.colocate_switch_s)  # then trains

    def on_trained(self, version: int) -> None:
        seconds = self.c.cost.colocate_switch_s
        self.c.pause(self.c.live(), seconds, "weights")
        for r in self.c.live():
            r.version = version
        self.c.at(self.c.now + seconds, lambda _, now: self.start())


class RuntimeLoop(Base):
    """The runtime's loop for one schedule value (see the module docstring). With `schedule.repack` the repack
    round runs every `repack.interval_s` and right after each trainer update, as the manager's does."""

    def __init__(self, cluster: Cluster, schedule: Schedule) -> None:
        super().__init__(cluster)
        self.schedule, self.rule = schedule, schedule.dispatch
        self.in_order, self.push, self.interrupt = schedule.in_order, schedule.push, schedule.interrupt
        self.relay_version = [0] * cluster.machines
        # what the manager knows, updated together when `rt.train` returns: the version and the groups consumed
        self.manager_version = 0
        self.manager_consumed = 0
        self.asking: dict[int, Replica] = {}  # replicas drained and refused work, by id
        self.orphans: dict[int, list[Traj]] = {}  # samples of dead replicas while none is alive, by group
        cost, spec, cfg = cluster.cost, cluster.spec, cluster.cfg
        typical = cfg.lengths.prompt_median + cfg.lengths.median
        self.batch_limit = cfg.repack.batch_limit_b or cost.batch_limit(spec, typical)
        self.blocks_total = cost.kv_capacity_tokens(spec) // cost.kv_block_tokens

    def start(self) -> None:
        for r in self.c.live():
            self.ask(r)
        if self.schedule.repack:
            self.c.at(self.cfg.repack.interval_s, self._tick)

    def ask(self, r: Replica) -> None:
        """A drained replica: pull the newest version at its relay, then ask for work."""
        if not r.alive or not r.idle:
            return
        newest = self.relay_version[r.machine]
        if newest > r.version:
            self.adopt(r, newest)
        c = self.c
        quota = self.rule.quota(
            r.version, self.manager_version, c.next_gid, self.manager_consumed, c.oldest_generating()
        )
        if quota <= 0:
            self.asking[r.rid] = r
            return
        self.asking.pop(r.rid, None)
        r.peak_kv = 0.0
        c.dispatch(r, quota)

    def adopt(self, r: Replica, version: int) -> None:
        if self.push:  # the broadcast already put it in GPU memory
            r.version = version
            self.c.record.weight_updates += 1
        else:
            self.c.pull(r, version)

    def wake(self) -> None:
        for rid in sorted(self.asking):
            self.ask(self.asking[rid])

    def on_drained(self, replica: Replica) -> None:
        self.ask(replica)

    def on_group_done(self, group: Group) -> None:
        self.c.try_train()

    def on_trained(self, version: int) -> None:
        c = self.c
        if self.push:
            stall = c.cost.global_broadcast_s(c.spec, c.rollout_gpus)
            c.trainer_stall(stall)
            for m in range(c.machines):
                c.at(c.now + stall, self._arrive, (m, version))
        else:
            stall = c.cost.publish_s(c.spec)
            c.trainer_stall(stall)
            for m in range(c.machines):
                c.at(c.now + stall + c.cost.relay_arrival_s(c.spec, m), self._arrive, (m, version))
        c.at(c.now + stall, self._updated, (version, c.consumed_groups))

    def _updated(self, arg: tuple[int, int], now: float) -> None:
        """`rt.train` returned: the manager learns the new version and the groups consumed."""
        self.manager_version, self.manager_consumed = arg
        self.wake()
        self.c.try_train()
        if self.schedule.repack:
            self.do_repack()

    def _arrive(self, arg: tuple[int, int], now: float) -> None:
        machine, version = arg
        self.relay_version[machine] = max(self.relay_version[machine], version)
        if self.interrupt:
            for r in self.c.live():
                if r.machine == machine and not r.idle and r.version < version:
                    self._resume_on(r, version)
        for rid in sorted(self.asking):
            if self.asking[rid].machine == machine:
                self.ask(self.asking[rid])

    def _resume_on(self, r: Replica, version: int) -> None:
        """Partial rollout: export everything in flight, load the new version, re-prefill and go on."""
        held = r.take_all(self.c.now)
        self.adopt(r, version)
        for t in held:
            t.versions += t.generated > 0
        r.add(held, self.c.now)

    def _tick(self, _: object, now: float) -> None:
        self.do_repack()
        self.c.at(now + self.cfg.repack.interval_s, self._tick)

    def do_repack(self) -> None:
        """Snapshot the replicas, ask the project's planner, move trajectories, free the sources.

        With `repack.only_with_work` only as many replicas are freed
        as the dispatch rule has a batch for, less the replicas already idle and asking (those refused until
        they pull take the room first): packing slows the packed tails, which pays only when a freed replica
        starts new work at once.
        """
        c, now = self.c, self.c.now
        max_released = None
        if self.cfg.repack.only_with_work:
            max_released = self.rule.replicas_with_work(
                c.next_gid,
                self.manager_consumed,
                len(self.asking),
                self.manager_version,
                c.oldest_generating(),
            )
            if max_released == 0:
                return
        block = c.cost.kv_block_tokens
        loads, trajs = [], {}
        for r in c.live():
            n = len(r.running) + len(r.parked)  # a request waiting for its tool moves too (the runtime's)
            if r.waiting or not n or n >= self.batch_limit:
                continue
            r.advance(now)
            if r.kv_used >= r.peak_kv:
                continue
            requests = []
            for t in r.running:  # ids name the group, as the runtime's do: repack keeps groups together
                requests.append((traj_id(t.group.gid, t.tid), math.ceil(r.context(t) / block)))
                trajs[requests[-1][0]] = t
            for t in r.parked:
                requests.append((traj_id(t.group.gid, t.tid), math.ceil((t.prompt + t.generated) / block)))
                trajs[requests[-1][0]] = t
            used = sum(b for _, b in requests)
            peak = max(used + 1, math.ceil(r.peak_kv / block))
            loads.append(
                ReplicaLoad(
                    r.rid, r.version, 0, len(requests), used, self.blocks_total, peak, tuple(requests)
                )
            )
        if len(loads) < 2:
            return
        plan = plan_with(
            self.cfg.repack,
            loads,
            trainer_version=self.manager_version,
            max_released=max_released,
            batch_limit_b=self.batch_limit,
        )
        if not plan.moves:
            return
        rec = c.record
        rec.repacks += 1
        rec.moved += len(plan.moves)
        rec.released += len(plan.released)
        rec.split_groups += split_groups(loads, plan)
        incoming: dict[int, list[Traj]] = {}
        for move in plan.moves:
            traj = trajs[move.request_id]
            c.replicas[move.source].take(traj)
            incoming.setdefault(move.destination, []).append(traj)
        overhead = c.cost.repack_overhead_s
        for rid, moved in incoming.items():
            dest = c.replicas[rid]
            dest.advance(now)
            dest.stall(now, overhead, "repack")
            dest.add(moved, now)
        for rid in plan.released:
            source = c.replicas[rid]
            source.stall(now, overhead, "repack")
            source.reschedule(now)
            self.ask(source)

    def on_failure(self, machine: int) -> None:
        """Laminar: only the dead machine's replicas stop: their trajectories continue on live replicas of the
        same version (re-prefilled from the partial response pool), else restart; a replacement joins later.
        The baselines stand for the paper's systems, which restart the whole job from its checkpoint."""
        if self.schedule.name != "laminar":
            self.c.global_restart()
            return
        c = self.c
        dead = [r for r in c.live() if r.machine == machine]
        homeless: dict[int, list[Traj]] = {}
        for r in dead:
            for t in r.take_all(c.now):
                homeless.setdefault(t.group.gid, []).append(t)
            r.alive = False
            c.at(c.now + c.cost.replica_restart_s, self._revive, r)
        self._place(homeless)

    def _place(self, homeless: dict[int, list[Traj]]) -> None:
        """Where each group goes is the runtime's own decision (`choose_target`): its version's least loaded
        replica, else a whole restart on the least loaded one; with no replica alive, it waits for one (as the
        runtime's supervisor keeps the work it cannot place)."""
        c = self.c
        for gid in sorted(homeless):
            trajs = homeless[gid]
            live = {x.rid: x.version for x in c.live()}
            load = {x.rid: len(x.running) + len(x.parked) + len(x.waiting) for x in c.live()}
            chosen = choose_target({t.version for t in trajs}, live, load)
            if chosen is None:
                self.orphans.setdefault(gid, []).extend(trajs)
                continue
            target, version, restart = chosen
            if restart:
                trajs = self._restart_group(trajs[0].group, trajs, version)
            else:
                c.record.recovered += len(trajs)
            c.replicas[target].add(trajs, c.now)

    def _restart_group(self, group: Group, homeless: list[Traj], version: int) -> list[Traj]:
        """The whole group from its prompt at `version`, as the runtime restarts it: its samples still running
        on live replicas (moved there by a repack) stop, and the buffer forgets those that had finished."""
        c = self.c
        again = list(homeless)
        for x in c.live():
            running = [t for t in x.running if t.group is group] + [t for t in x.parked if t.group is group]
            waiting = [t for t in x.waiting if t.group is group]
            if not running and not waiting:
                continue
            x.advance(c.now)
            again += [x.take(t) for t in running]
            for t in waiting:
                x.waiting.remove(t)
            again += waiting
            x.reschedule(c.now)
        finished = [t for t in group.trajs if all(t is not a for a in again)]
        group.pending += len(finished)
        for t in finished if c.audit else ():
            c.finish_count[t.tid] -= 1
            if not c.finish_count[t.tid]:
                del c.finish_count[t.tid]
        for t in again + finished:
            t.rewind()
            t.version, t.versions = version, 1
        c.regenerate(group, version)
        c.record.restarted += len(again) + len(finished)
        return again + finished

    def _revive(self, r: Replica, now: float) -> None:
        r.alive = True
        r.t_last = max(r.t_last, now)
        r.version = -1  # a fresh process: pulls whatever its relay holds
        self.ask(r)
        if self.orphans:
            orphans, self.orphans = self.orphans, {}
            self._place(orphans)


def loop_for(cluster: Cluster) -> Base:
    """What runs the configured schedule: the runtime's loop with its schedule value, or colocated `verl`."""
    if cluster.cfg.schedule.name == "verl":
        return Verl(cluster)
    return RuntimeLoop(cluster, schedule_of(cluster))
