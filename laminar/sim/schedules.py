"""The schedules of design section 8 on the simulated cluster, each a short class that reads like its rule.

sync      generate a global batch with version v, wait for its last trajectory, train, broadcast, repeat
verl      sync with trainer and rollouts colocated on every GPU (switching costs instead of a broadcast)
one_step  generate batch b+1 while training on batch b; broadcast at every step
stream    continuous generation, staleness bound k (AReaL's admission rule); the global update waits until
          every in-flight trajectory has ended
partial   continuous generation, bound k; every update interrupts all trajectories and resumes them on the
          new weights after a re-prefill (AReaL / Kimi partial rollout)
laminar   trajectory-level asynchrony: relay chain, pulls between batches, dynamic repack (and ablations)
"""

from __future__ import annotations

import math

from laminar.manager.repack import ReplicaLoad, plan_repack
from laminar.sim.cluster import Cluster
from laminar.sim.replica import Group, Replica, Traj


class Base:
    """Default hooks: do nothing."""

    staleness_bound: int | None = None

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

    def dispatch_batch(self) -> None:
        """Spread one global batch of groups evenly over the live replicas."""
        live = self.c.live()
        g = self.cfg.groups_per_step
        for i, r in enumerate(live):
            self.c.dispatch(r, g // len(live) + (i < g % len(live)))

    def replica_groups(self, ahead_batches: float) -> int:
        """Groups a replica takes at once: enough to fill it, but no more than its share of what may be
        outstanding (at 1024 GPUs a global batch covers only a few sequences per replica)."""
        fill = max(1, int(self.cfg.replica_fill * self.c.cost.max_num_seqs / self.cfg.group_size))
        share = math.ceil(ahead_batches * self.cfg.groups_per_step / max(1, len(self.c.live())))
        return max(1, min(fill, share))


class Sync(Base):
    def start(self) -> None:
        self.left = self.cfg.groups_per_step
        self.dispatch_batch()

    def on_group_done(self, group: Group) -> None:
        self.left -= 1
        if self.left == 0:
            self.c.try_train()

    def on_trained(self, version: int) -> None:
        self.c.global_push(version, then=self.start)


class Verl(Sync):
    """Colocated: every GPU generates, then every GPU trains; each phase switch offloads and reloads."""

    def on_group_done(self, group: Group) -> None:
        self.left -= 1
        if self.left == 0:
            self.c.trainer_stall(self.c.cost.colocate_switch_s)

    def on_trained(self, version: int) -> None:
        seconds = self.c.cost.colocate_switch_s
        self.c.pause(self.c.live(), seconds, "weights")
        for r in self.c.live():
            r.version = version
        self.c.at(self.c.now + seconds, lambda _, now: self.start())


class OneStep(Base):
    def start(self) -> None:
        self.generating = True
        self.trainer_idle = True
        self.left = self.cfg.groups_per_step
        self.dispatch_batch()

    def on_group_done(self, group: Group) -> None:
        self.left -= 1
        if self.left == 0:
            self.generating = False
            self._sync()

    def on_trained(self, version: int) -> None:
        self.trainer_idle = True
        self._sync()

    def _sync(self) -> None:
        """Both sides ready: push the newest weights, generate the next batch, train on the finished one."""
        if self.generating or not self.trainer_idle:
            return
        if self.c.version > self.c.replicas[0].version:
            self.c.global_push(self.c.version)
        self.generating, self.trainer_idle = True, False
        self.left = self.cfg.groups_per_step
        self.dispatch_batch()
        self.c.try_train()


class Continuous(Base):
    """What stream and partial share: each replica is topped up as trajectories finish, under AReaL's
    admission rule (no more than (v + k + 1) global batches dispatched while the rollouts run version v)."""

    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster)
        self.staleness_bound = self.cfg.staleness_k
        self.rollout_version = 0
        self.per_replica = self.replica_groups(self.cfg.staleness_k + 1)

    def quota(self) -> int:
        limit = (self.rollout_version + self.cfg.staleness_k + 1) * self.cfg.groups_per_step
        return limit - self.c.next_gid

    def fill(self, r: Replica) -> None:
        want = self.per_replica - (len(r.running) + len(r.waiting)) // self.cfg.group_size
        if want > 0 and r.alive:
            self.c.dispatch(r, min(want, self.quota()))

    def fill_all(self) -> None:
        for r in self.c.live():
            self.fill(r)

    def start(self) -> None:
        self.fill_all()

    def on_group_done(self, group: Group) -> None:
        self.c.try_train()


class Stream(Continuous):
    def __init__(self, cluster: Cluster) -> None:
        super().__init__(cluster)
        self.updating = False

    def fill(self, r: Replica) -> None:
        if not self.updating:
            super().fill(r)

    def on_traj_done(self, traj: Traj, replica: Replica) -> None:
        if not replica.waiting:
            self.fill(replica)

    def on_drained(self, replica: Replica) -> None:
        self.fill(replica)
        self._maybe_update()

    def on_trained(self, version: int) -> None:
        self.c.try_train()
        self._maybe_update()

    def _maybe_update(self) -> None:
        """Rollouts keep the old version while its quota lasts; once they have all run dry and a newer
        version exists, one global push updates everybody (nothing is interrupted)."""
        if self.updating or self.c.version <= self.rollout_version or self.quota() > 0:
            return
        if any(not r.idle for r in self.c.live()):
            return
        self.updating = True
        self.c.global_push(self.c.version, then=self._resume)

    def _resume(self) -> None:
        self.updating = False
        self.rollout_version = self.c.version_pushed
        self.fill_all()


class Partial(Continuous):
    def on_traj_done(self, traj: Traj, replica: Replica) -> None:
        if not replica.waiting:
            self.fill(replica)

    def on_drained(self, replica: Replica) -> None:
        self.fill(replica)

    def on_trained(self, version: int) -> None:
        """Interrupt everything, broadcast, resume every trajectory on the new weights (re-prefill)."""
        c = self.c
        held = {r: r.take_all(c.now) for r in c.live()}
        c.global_push(version)
        self.rollout_version = version
        for r, trajs in held.items():
            for t in trajs:
                t.versions += t.generated > 0
            r.add(trajs, c.now)
        self.fill_all()
        c.try_train()


class Laminar(Base):
    """Each replica pulls the newest version at its relay whenever its batch ends or repack frees it."""

    def __init__(self, cluster: Cluster, *, repack: bool = True, relay: bool = True) -> None:
        super().__init__(cluster)
        self.repack, self.relay = repack, relay
        self.relay_version = [0] * cluster.machines
        self.waiting_for_quota: list[Replica] = []
        self.per_replica = self.replica_groups(self.cfg.max_ahead_batches)
        cost, spec = cluster.cost, cluster.spec
        typical = self.cfg.lengths.prompt_median + self.cfg.lengths.median
        self.batch_limit = self.cfg.repack_batch_limit or cost.batch_limit(spec, typical)
        self.blocks_total = cost.kv_capacity_tokens(spec) // cost.kv_block_tokens

    def quota(self) -> int:
        return int(self.cfg.max_ahead_batches * self.cfg.groups_per_step) - self.c.n_unconsumed

    def start(self) -> None:
        for r in self.c.live():
            self.refill(r)
        if self.repack:
            self.c.at(self.cfg.repack_interval_s, self._tick)

    def refill(self, r: Replica) -> None:
        """Between batches: pull the newest version here, then take a new batch of prompts if allowed."""
        if not r.alive or not r.idle:
            return
        newest = self.relay_version[r.machine]
        if newest > r.version:
            self.c.pull(r, newest)
        groups = min(self.per_replica, self.quota())
        if groups <= 0:
            self.waiting_for_quota.append(r)
            return
        r.peak_kv = 0.0
        self.c.dispatch(r, groups)

    def on_drained(self, replica: Replica) -> None:
        self.refill(replica)

    def on_group_done(self, group: Group) -> None:
        self.c.try_train()

    def on_trained(self, version: int) -> None:
        c = self.c
        if self.relay:
            stall = c.cost.publish_s(c.spec)
            c.trainer_stall(stall)
            for m in range(c.machines):
                c.at(c.now + stall + c.cost.relay_arrival_s(c.spec, m), self._arrive, (m, version))
        else:  # ablation: a GPU-side global broadcast pauses the trainer and every rollout
            seconds = c.cost.global_broadcast_s(c.spec, c.rollout_gpus)
            c.trainer_stall(seconds)
            c.pause(c.live(), seconds, "weights")
            for m in range(c.machines):
                c.at(c.now + seconds, self._arrive, (m, version))
        waiting, self.waiting_for_quota = self.waiting_for_quota, []
        for r in waiting:
            self.refill(r)
        if self.repack:
            self.do_repack()

    def _arrive(self, arg: tuple[int, int], now: float) -> None:
        machine, version = arg
        self.relay_version[machine] = max(self.relay_version[machine], version)

    def _tick(self, _: object, now: float) -> None:
        self.do_repack()
        self.c.at(now + self.cfg.repack_interval_s, self._tick)

    def do_repack(self) -> None:
        """Snapshot the idle replicas, ask the project's planner, move trajectories, free the sources.

        Only when the prompt pool has a batch for a freed replica: packing tails onto fewer replicas slows
        those tails, which pays only if the freed GPUs have new work.
        """
        if self.quota() < self.per_replica:
            return
        c, now = self.c, self.c.now
        block = c.cost.kv_block_tokens
        idle: dict[int, list[Replica]] = {}
        for r in c.live():
            n = len(r.running)
            if r.waiting or not n or n >= self.batch_limit:
                continue
            r.advance(now)
            if r.kv_used < r.peak_kv:
                idle.setdefault(r.version, []).append(r)
        loads, trajs = [], {}
        for group in idle.values():
            if len(group) < 2:
                continue
            for r in group:
                requests = []
                for t in r.running:
                    requests.append((str(t.tid), math.ceil(r.context(t) / block)))
                    trajs[str(t.tid)] = t
                used = sum(b for _, b in requests)
                peak = max(used + 1, math.ceil(r.peak_kv / block))
                load = ReplicaLoad(
                    r.rid, r.version, 0, len(requests), used, self.blocks_total, peak, tuple(requests)
                )
                loads.append(load)
        if len(loads) < 2:
            return
        plan = plan_repack(
            loads,
            batch_limit_b=self.batch_limit,
            kv_capacity_frac=self.cfg.repack_kv_frac,
            max_released=self.quota() // self.per_replica,
        )
        if not plan.released:
            return
        rec = c.record
        rec.repacks += 1
        rec.moved += len(plan.moves)
        rec.released += len(plan.released)
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
            self.refill(source)

    def on_failure(self, machine: int) -> None:
        """Only the dead machine's replicas stop: their trajectories continue on live replicas of the same
        version (re-prefilled from the partial response pool), else restart; a replacement joins later."""
        c = self.c
        dead = [r for r in c.live() if r.machine == machine]
        for r in dead:
            trajs = r.take_all(c.now)
            r.alive = False
            c.at(c.now + c.cost.replica_restart_s, self._revive, r)
            for t in trajs:
                same = [x for x in c.live() if x.version == t.version]
                if same:
                    c.record.recovered += 1
                    dest = min(same, key=lambda x: (len(x.running) + len(x.waiting), x.rid))
                else:
                    c.record.restarted += 1
                    t.generated = 0.0
                    dest = min(c.live(), key=lambda x: (len(x.running) + len(x.waiting), x.rid))
                dest.add([t], c.now)

    def _revive(self, r: Replica, now: float) -> None:
        r.alive = True
        r.t_last = max(r.t_last, now)
        r.version = -1  # a fresh process: pulls whatever its relay holds
        self.refill(r)


def make_schedule(cluster: Cluster):
    name = cluster.cfg.schedule
    if name == "sync":
        return Sync(cluster)
    if name == "verl":
        return Verl(cluster)
    if name == "one_step":
        return OneStep(cluster)
    if name == "stream":
        return Stream(cluster)
    if name == "partial":
        return Partial(cluster)
    if name == "laminar":
        return Laminar(cluster)
    if name == "laminar_no_repack":
        return Laminar(cluster, repack=False)
    if name == "laminar_global_push":
        return Laminar(cluster, relay=False)
    raise ValueError(f"schedule={name!r} has no simulator implementation")
