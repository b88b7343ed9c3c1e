"""When a replica may have work: one small rule per schedule, asked by the manager each time a replica asks
(`RolloutManager.next_work`). A rule sees only the replica's weight version, the trainer's, and how many groups
were dispatched and trained on so far. No Ray here: the cluster simulator (`laminar.sim`) asks the same rules."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Dispatch:
    """Laminar's rule: a replica that asks gets work at once, with whatever version it holds, as long as fewer
    than `max_outstanding_groups` are dispatched and not yet trained on (flow control, so a fast rollout tier
    cannot run arbitrarily far ahead of the trainer). Schedules subclass it to say when else work may start."""

    groups_per_batch: int
    max_outstanding_groups: int

    def quota(self, replica_version: int, trainer_version: int, dispatched: int, consumed: int) -> int:
        return max(0, min(self.groups_per_batch, self.room(dispatched, consumed)))

    def room(self, dispatched: int, consumed: int) -> int:
        """Groups that may still be dispatched now, over all replicas."""
        return max(0, self.max_outstanding_groups - (dispatched - consumed))

    def replicas_with_work(self, dispatched: int, consumed: int) -> int:
        """How many freed replicas would get a full batch at once: what repack may release."""
        return self.room(dispatched, consumed) // max(1, self.groups_per_batch)


@dataclass
class SyncDispatch(Dispatch):
    """sync (`ahead` 0) and one_step (`ahead` 1): batch v + ahead may be generated once the replica holds the
    trainer's version v."""

    groups_per_step: int = 1
    ahead: int = 0  # batches generated ahead of training: 0 for sync, 1 for one_step

    def quota(self, replica_version: int, trainer_version: int, dispatched: int, consumed: int) -> int:
        if replica_version != trainer_version:  # the new version must be loaded first
            return 0
        batch_end = (trainer_version + 1 + self.ahead) * self.groups_per_step
        return max(0, min(self.groups_per_batch, batch_end - dispatched))


@dataclass
class BoundedDispatch(Dispatch):
    """stream and partial: work only on the newest version, and only as far ahead as staleness k allows: a
    group dispatched now is trained no later than k versions from now."""

    groups_per_step: int = 1
    staleness: int = 1

    def quota(self, replica_version: int, trainer_version: int, dispatched: int, consumed: int) -> int:
        if replica_version != trainer_version:
            return 0
        bound = (trainer_version + self.staleness + 1) * self.groups_per_step
        return max(0, min(self.groups_per_batch, bound - dispatched))
