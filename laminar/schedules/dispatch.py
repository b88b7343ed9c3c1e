"""When a replica may have work: one small rule, asked by the manager each time a replica asks
(`RolloutManager.next_work`). A rule sees only the replica's weight version, the trainer's, and how many groups
were dispatched and trained on so far. No Ray here: the cluster simulator (`laminar.sim`) asks the same rule."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dispatch:
    """Without `ahead` (Laminar): a replica that asks gets work at once, with whatever version it holds, as long
    as fewer than `max_outstanding_groups` are dispatched and not yet trained on (flow control, so a fast rollout
    tier cannot run arbitrarily far ahead of the trainer).

    With `ahead` (sync 0, one_step 1, stream and partial k): only a replica holding the trainer's version v gets
    work, and only up to the end of batch v + ahead, so a group dispatched now is trained no later than `ahead`
    versions from now.

    `max_lag` (Laminar, None = no bound; `schedule.max_lag`, whose default is 0): a replica more than `max_lag`
    versions behind the trainer gets no new work until it has pulled a newer version. With 0, a group starts on
    the trainer's newest version, so the version a replica held while the new one travelled to its relay adds
    nothing to the group's staleness; work in flight is never stopped (unlike `ahead`, nothing waits for the
    newest version but new work).

    `max_staleness` (Laminar, None = no bound; `schedule.max_staleness`, default 4): no group is trained more
    than this many versions after the one that generates it, however long it runs. The trainer takes at least
    `groups_per_step` groups a version, so with `oldest` the oldest version a group still generating holds and
    v the trainer's, it can reach version `oldest + max_staleness + 1` without that group only by training more
    than `(oldest + max_staleness + 1 - v) * groups_per_step` other groups: new work is handed out only while
    fewer are outstanding. The bound holds for a buffer that takes complete groups in completion order or
    oldest first (`buffer.sampler` fifo or oldest); it binds only while a long tail keeps an old group running,
    and then only the trainer waits for it, never the group for the trainer (unlike `ahead`, where every
    group's batch is fixed at dispatch)."""

    groups_per_batch: int
    max_outstanding_groups: int
    groups_per_step: int = 1
    ahead: int | None = None
    max_lag: int | None = None
    max_staleness: int | None = None

    def quota(
        self,
        replica_version: int,
        trainer_version: int,
        dispatched: int,
        consumed: int,
        oldest: int | None = None,
        first_version: int = 0,
    ) -> int:
        """Groups the replica asking may take now. `oldest`: the oldest version any group dispatched and not yet
        complete holds (None: none is out). `first_version`: the version `dispatched` and `consumed` count from
        (a resumed run's checkpoint; batch v + ahead ends `v - first_version + 1 + ahead` batches in)."""
        if self.ahead is None:
            if self.max_lag is not None and trainer_version - replica_version > self.max_lag:
                return 0  # pull first
            oldest = replica_version if oldest is None else min(oldest, replica_version)
            return max(
                0, min(self.groups_per_batch, self.room(dispatched, consumed, trainer_version, oldest))
            )
        if replica_version != trainer_version:  # the new version must be loaded first
            return 0
        bound = (trainer_version - first_version + 1 + self.ahead) * self.groups_per_step
        return max(0, min(self.groups_per_batch, bound - dispatched))

    def room(
        self, dispatched: int, consumed: int, trainer_version: int = 0, oldest: int | None = None
    ) -> int:
        """Groups that may still be dispatched now, over all replicas: `max_outstanding_groups`, and with
        `max_staleness` what the oldest group out (or, none out, the newest work's version) leaves."""
        out = dispatched - consumed
        room = self.max_outstanding_groups - out
        if self.max_staleness is not None and oldest is not None:
            bound = (oldest + self.max_staleness + 1 - trainer_version) * self.groups_per_step
            room = min(room, bound - out)
        return max(0, room)

    def replicas_with_work(
        self,
        dispatched: int,
        consumed: int,
        waiting: int = 0,
        trainer_version: int = 0,
        oldest: int | None = None,
    ) -> int:
        """How many freed replicas would get a full batch at once: what repack may release. `waiting` replicas
        are idle and asking already (e.g. refused by `max_lag` until they pull): the room is theirs first. A
        freed replica would take work on the trainer's version (`oldest`: as in `quota`)."""
        oldest = trainer_version if oldest is None else min(oldest, trainer_version)
        room = self.room(dispatched, consumed, trainer_version, oldest)
        return max(0, room // max(1, self.groups_per_batch) - waiting)
