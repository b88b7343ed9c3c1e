"""A tensor-parallel replica: one engine run by N ranks (`laminar.engine.tensor_parallel`), rank 0 the replica the
manager talks to, ranks 1..N-1 following its engine calls.

Rank 0's `RolloutReplica` holds a `Leader` where it would hold an `Engine`: every call that changes the engine
(a request added, aborted, moved, parked or resumed, a step, a weight load) is sent to the other ranks before rank
0 makes it, and each rank makes the same call on its own shard (`follow`). The engine is deterministic given its
calls, so the ranks' all-reduces line up and every rank samples the same token from the request's counter-based
stream (nothing is broadcast but the calls). Reads (stats, progress, version) are rank 0's alone. So the manager,
repack, recovery, tool turns and heartbeats see one replica, as at one rank.

Weights: rank 0 leases the relay slot and sends its file; every rank maps it and copies its own slices out of the
flat buffer (`shard_spec`: views, no gather), and rank 0 releases the lease once every rank has said it is
done. One version for every rank: the one rank 0 leased, applied by all before the next call.

Moves: an exported request carries its keys and values whole (each rank's KV heads gathered on rank 0,
`gather_kv`), and an imported one is split for this replica's degree (`split_kv`), so a request moves between
replicas of any degree with its cache (one of the same degree gets back exactly the shards it would have had).

The loss of any rank is the loss of the replica: a rank that dies breaks the next collective on the others, rank
0's loop raises, and the supervisor replaces the whole group (its placement group removed) and recovers its work
as for any lost replica. A following rank whose call fails (anything but a request refused for its arguments,
as rank 0 refuses it too) ends its process, which rank 0 sees the same way.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from laminar.engine.sequence import ExportedRequest
from laminar.engine.tensor_parallel import TPGroup, gather_kv, split_kv

# calls a rank may see refused for their arguments (KeyError, ValueError: rank 0 raises the same and hands the
# error to its caller); anything else that raises on a following rank ends it
REQUEST_CALLS = ("add_request", "abort", "export_request", "import_request", "park", "resume")


@dataclasses.dataclass
class Channel:
    """Rank 0's calls to the other ranks, pickled, over a gloo group of its own (beside the model's NCCL or gloo
    all-reduces). Its timeout bounds how long a following rank waits for rank 0's next call."""

    rank: int
    world: int
    group: Any

    @classmethod
    def join(cls, rank: int, world: int, idle_s: float) -> Channel:
        return cls(rank, world, dist.new_group(backend="gloo", timeout=timedelta(seconds=idle_s)))

    def send(self, call: tuple[str, tuple]) -> None:
        dist.broadcast_object_list([call], src=0, group=self.group)

    def receive(self) -> tuple[str, tuple]:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, x: Any) -> list[Any]:
        """Every rank's `x` on rank 0 (in rank order); [] elsewhere."""
        out: list[Any] = [None] * self.world if self.rank == 0 else []
        dist.gather_object(x, out if self.rank == 0 else None, dst=0, group=self.group)
        return out


def join_group(
    rank: int, world: int, address: tuple[str, int], cuda: bool, timeout_s: float, idle_s: float
) -> tuple[TPGroup, Channel]:
    """This process's place in a replica's ranks: the model's process group (NCCL on CUDA, gloo on CPU; a
    collective that waits `timeout_s` for a rank raises) and the channel of rank 0's calls."""
    host, port = address
    dist.init_process_group(
        "nccl" if cuda else "gloo",
        init_method=f"tcp://{host}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    return TPGroup(rank, world), Channel.join(rank, world, idle_s)


def own_import(exported: ExportedRequest, engine: Any, rank: int, world: int) -> ExportedRequest:
    """A request with whole keys and values as this rank takes it: its KV heads only."""
    if exported.kv is None or world == 1:
        return exported
    return dataclasses.replace(exported, kv=split_kv(exported.kv, engine.config, world)[rank])


def load_slot(engine: Any, reader: Any, path: str, nbytes: int, layout: Any, version: int) -> None:
    """This rank's slices of the relay slot at `path` into its engine (`SlotReader`: mapped once, kept)."""
    reader.load(engine.load_weights, path, nbytes, layout, version)


class Leader:
    """Rank 0's engine as its replica sees it: the calls that change it are made on every rank, reads are rank
    0's. `reader` maps relay slots (`laminar.relay.pull.SlotReader`); `pids`: every rank's process, rank 0's first
    (what a test kills)."""

    def __init__(
        self, engine: Any, channel: Channel, reader: Any, pids: list[int], handles: tuple = ()
    ) -> None:
        """`handles`: the other ranks' actors, held while rank 0 lives (an actor nobody holds is ended)."""
        self.engine, self.channel, self.reader, self.pids = engine, channel, reader, pids
        self.world, self.handles = channel.world, handles

    def __getattr__(self, name: str) -> Any:  # reads: stats, progress, loss_mask, version, block_size ...
        return getattr(self.engine, name)

    def _all(self, name: str, *args: Any) -> Any:
        self.channel.send((name, args))
        return getattr(self.engine, name)(*args)

    def add_request(self, *args: Any) -> None:
        self._all("add_request", *args)

    def abort(self, request_id: str) -> None:
        self._all("abort", request_id)

    def step(self) -> Any:
        return self._all("step")

    def has_unfinished(self) -> bool:
        return self._all("has_unfinished")

    def reset_peak(self) -> None:
        self._all("reset_peak")

    def park(self, request_id: str) -> None:
        self._all("park", request_id)

    def resume(self, request_id: str, context_ids: list[int]) -> Any:
        return self._all("resume", request_id, context_ids)

    def export_request(self, request_id: str, with_kv: bool = False) -> ExportedRequest:
        """With `with_kv`, every rank's KV heads joined into the whole (`gather_kv`)."""
        exported = self._all("export_request", request_id, with_kv)
        if exported.kv is None:
            return exported
        shards = [exported.kv, *self.channel.gather(None)[1:]]
        return dataclasses.replace(exported, kv=gather_kv(shards, self.engine.config))

    def import_request(self, exported: ExportedRequest) -> None:
        self.channel.send(("import_request", (exported,)))
        self.engine.import_request(own_import(exported, self.engine, 0, self.world))

    def load_slot(self, path: str, nbytes: int, layout: Any, version: int) -> None:
        """Every rank's slices of the slot; returns once every rank has copied them (the lease may go)."""
        self.channel.send(("load_slot", (path, nbytes, layout, version)))
        error = None
        try:
            load_slot(self.engine, self.reader, path, nbytes, layout, version)
        except Exception as e:  # noqa: BLE001 - every rank answers before anyone raises
            error = repr(e)
        errors = [error, *self.channel.gather(None)[1:]]
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            raise RuntimeError(f"version {version}: ranks failed to load it: {failed}")


def follow(engine: Any, channel: Channel, reader: Any) -> None:
    """A following rank's life: make rank 0's calls on this rank's engine until the process ends. A call that
    fails here and not on rank 0, or a channel that breaks (rank 0 is gone), ends the process: its sockets close,
    the next collective breaks on the other ranks, and the replica is replaced."""
    try:
        while True:
            try:
                name, args = channel.receive()
            except RuntimeError:  # rank 0 is gone (its replica ended or was lost): so is this rank, quietly
                os._exit(0)
            try:
                _make(engine, channel, reader, name, args)
            except (KeyError, ValueError):
                if name not in REQUEST_CALLS:
                    raise
                # refused for its arguments, here as on rank 0 (the same engine, the same calls), which told its
                # caller
    except BaseException:  # noqa: BLE001 - see the docstring
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _make(engine: Any, channel: Channel, reader: Any, name: str, args: tuple) -> None:
    """One of rank 0's calls on this rank."""
    if name == "load_slot":
        error = None
        try:
            load_slot(engine, reader, *args)
        except Exception as e:  # noqa: BLE001 - rank 0 names it, then every rank goes
            error = repr(e)
        channel.gather(error)
        if error is not None:
            raise RuntimeError(f"rank {channel.rank}: {error}")
    elif name == "import_request":
        engine.import_request(own_import(args[0], engine, channel.rank, channel.world))
    elif name == "export_request":
        exported = engine.export_request(*args)
        if exported.kv is not None:
            channel.gather(exported.kv)
    else:
        getattr(engine, name)(*args)
