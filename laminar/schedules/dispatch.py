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
    newest version but new work)."""

    groups_per_batch: int
    max_outstanding_groups: int
    groups_per_step: int = 1
    ahead: int | None = None
    max_lag: int | None = None

    def quota(self, replica_version: int, trainer_version: int, dispatched: int, consumed: int) -> int:
        if self.ahead is None:
            if self.max_lag is not None and trainer_version - replica_version > self.max_lag:
                return 0  # pull first
            return max(0, min(self.groups_per_batch, self.room(dispatched, consumed)))
        if replica_version != trainer_version:  # the new version must be loaded first
            return 0
        bound = (trainer_version + 1 + self.ahead) * self.groups_per_step
        return max(0, min(self.groups_per_batch, bound - dispatched))

    def room(self, dispatched: int, consumed: int) -> int:
        """Groups that may still be dispatched now, over all replicas."""
        return max(0, self.max_outstanding_groups - (dispatched - consumed))

    def replicas_with_work(self, dispatched: int, consumed: int, waiting: int = 0) -> int:
        """How many freed replicas would get a full batch at once: what repack may release. `waiting` replicas
        are idle and asking already (e.g. refused by `max_lag` until they pull): the room is theirs first."""
        return max(0, self.room(dispatched, consumed) // max(1, self.groups_per_batch) - waiting)
