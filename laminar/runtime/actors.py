"""Thin Ray actor wrappers around the trainer and the rollout replica, so every process boundary is a Ray actor
and every part stays testable without Ray. (The control plane's data actors, which also survive their own loss,
are `laminar.runtime.control`'s.)"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import ray

from laminar.data.records import Trajectory
from laminar.data.staleness import staleness

log = logging.getLogger(__name__)


@ray.remote(max_concurrency=4)
class TrainerActor:
    """One rank of the trainer plus its share of the weight publish: each step trains, then copies the new
    version into shared memory for the master relay and returns (the publish is the trainer's only stall).
    With one rank (`world=1`) it holds the whole model and publishes it; with several, each rank is one FSDP
    shard (`join` first), writes its own rows into rank 0's publish slot, and rank 0 hands the slot over. A rank
    on another machine than rank 0 (`trainer.placement=spread`) sends its rows to the master relay instead
    (`Relay.piece`), which assembles the version from the slot and the pieces before anyone may pull it."""

    def __init__(self, trainer_args: dict[str, Any], slots: int, rank: int = 0, world: int = 1) -> None:
        """`trainer_args`: the trainer's constructor arguments (`laminar.runtime.trainer_group.trainer_args`)."""
        # Before this process's first CUDA allocation: segments that grow in place. A 14B-shaped model's FSDP
        # rank on an H200 ran out of memory in its first long step with 5.8 GiB free but fragmented, and ran
        # with them (results/tensor-parallel/). A value the user set is kept.
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        self.args, self.slots, self.rank, self.world = trainer_args, slots, rank, world
        self.trainer: Any = None
        self.publisher: Any = None
        self.writer: Any = None
        self.layout: Any = None
        self.master: Any = None
        self.remote_ranks = 0  # ranks on other machines than rank 0 (they send pieces)
        self.remote = False  # this rank is one of them
        self.pieces: list[Any] = []  # this rank's piece calls still unanswered

    def load(self) -> None:
        """A single rank's policy (and optimizer), built here rather than in the constructor so that the actor
        answers `node_id` at once: the runtime starts the rollouts while the policy loads. Several ranks build
        theirs in `join`."""
        from laminar.trainer.trainer import Trainer

        self.trainer = Trainer(**self.args)
        self._prepare_slots()

    def _prepare_slots(self) -> None:
        """Once both the policy and the publisher exist (either comes first): the publish slots made and
        page-locked in the background while the first rollouts run (`WeightPublisher.prepare`)."""
        if self.trainer is None or self.publisher is None:
            return
        from laminar.engine.layout import WeightLayout

        specs = self.trainer.publish_specs()
        if specs is not None:
            self.publisher.prepare(WeightLayout.of_specs(specs).total_bytes)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the others (`join`): this node's address and a free port."""
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def join(self, host: str, port: int) -> None:
        """Join the process group (NCCL on GPU, gloo on CPU) and build this rank's shard of the policy."""
        import torch
        import torch.distributed as dist

        from laminar.relay.publisher import ShardWriter
        from laminar.trainer.trainer import Trainer

        cuda = self.args["device"].startswith("cuda")
        if cuda:
            torch.cuda.set_device(0)  # Ray shows each rank its own GPU only
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world,
        )
        self.trainer = Trainer(**self.args, rank=self.rank, world=self.world)
        self.writer = ShardWriter()
        nodes: list[Any] = [None] * self.world
        dist.all_gather_object(nodes, self.node_id())
        self.remote = nodes[self.rank] != nodes[0]
        self.remote_ranks = sum(n != nodes[0] for n in nodes)
        self._prepare_slots()

    def attach_master(self, master: Any) -> None:
        from laminar.relay.publisher import WeightPublisher

        self.master = master
        if self.rank != 0:
            return
        if self.publisher is None:
            self.publisher = WeightPublisher(master, num_slots=self.slots)
            self._prepare_slots()
        else:
            self.publisher.set_master(master)

    def version(self) -> int:
        return self.trainer.version

    def republish(self) -> float:
        """The current version again, into a master relay that does not hold it (one that replaced a dead
        master: the dead one may have taken the newest version with it). Returns the stall."""
        return self._publish()

    def check_finite(self) -> None:
        self.trainer.check_finite()

    def step(self, groups: list[list[Trajectory]]) -> dict[str, Any]:
        consumer_version = self.trainer.version
        t0 = time.time()
        metrics = self.trainer.train_step(groups)
        t_trained = time.time()
        stall = self._publish()
        trajs = [t for g in groups for t in g]
        return {
            **metrics,
            "version": self.trainer.version,
            "t_start": t0,
            "t_publish": t_trained,
            "stall_s": stall,
            "tokens": sum(t.num_tokens for t in trajs),
            "response_tokens": sum(len(t.response_ids) for t in trajs),
            "reward_mean": sum(t.reward for t in trajs) / max(len(trajs), 1),
            # tool turns: calls whose output came back, per trajectory, and the share that made one
            "tool_calls_mean": sum(t.tool_outputs for t in trajs) / max(len(trajs), 1),
            "tool_call_frac": sum(t.tool_outputs > 0 for t in trajs) / max(len(trajs), 1),
            "reprefill_tokens": sum(t.reprefill_tokens for t in trajs),
            "staleness": [staleness(consumer_version, t.version) for t in trajs],
            "traj_ids": [t.traj_id for t in trajs],
            "traj_versions": {t.traj_id: sorted(t.versions) for t in trajs},
        }

    def _publish(self) -> float:
        """The new version into a publish slot; returns the stall. Sharded: rank 0 picks the slot, every rank
        writes its rows there, and once all have (the slowest rank's copy) rank 0 commits it."""
        # the weights are judged finite while they copy out; an unfinished check holds back the commit
        t0 = time.perf_counter()
        parts, flag = self.trainer.publish_parts()
        if self.world == 1:
            return self.publisher.publish(
                self.trainer.version,
                parts,
                check=lambda: self.trainer.raise_nonfinite(flag, summary=True),
                t0=t0,
            )
        import torch.distributed as dist

        from laminar.engine.layout import WeightLayout

        shards = parts
        if self.layout is None:
            self.layout = WeightLayout.of_specs([(s.name, s.shape, s.dtype) for s in shards])
        where: list[Any] = [None]
        if self.rank == 0:
            slot, where[0] = self.publisher.reserve(self.layout.total_bytes)
        dist.broadcast_object_list(where, src=0)
        # a rank on another machine sends its rows to the master relay (through its own object store) once
        # the ranks agree they are finite
        piece = self.writer.pack(self.layout, shards) if self.remote else None
        if piece is None:
            self.writer.write(where[0], self.layout, shards)
        # an all-reduce: every rank has written its rows (the barrier)
        self.trainer.raise_nonfinite(flag, summary=True)
        if piece is not None:
            self._collect_pieces()
            self.pieces.append(self.master.piece.remote(self.trainer.version, *piece))
        if self.rank != 0:
            return time.perf_counter() - t0
        return self.publisher.commit(
            slot, self.trainer.version, self.layout.total_bytes, self.layout, t0, pieces=self.remote_ranks
        )

    def _collect_pieces(self) -> None:
        """Forget answered piece calls; a failed one is logged (the master relay will not expose that version)."""
        if not self.pieces:
            return
        ready, self.pieces = ray.wait(self.pieces, num_returns=len(self.pieces), timeout=0)
        for ref in ready:
            try:
                ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a dead master relay must not stop training
                log.warning(
                    "trainer rank %d: a piece of a version did not reach the master relay: %r", self.rank, e
                )

    def replay(self, groups: list[list[Trajectory]]) -> int:
        """Train on a batch again without publishing: a restarted trainer catching up from its checkpoint."""
        self.trainer.train_step(groups)
        return self.trainer.version

    def save_checkpoint(self, path: str) -> str:
        return str(self.trainer.save_checkpoint(path))

    def load_checkpoint(self, path: str) -> int:
        self.trainer.load_checkpoint(path)
        return self.trainer.version

    def close(self) -> None:
        """Unlink the publish slots in /dev/shm (ray.kill gives a process no chance to)."""
        if self.publisher is not None:
            self.publisher.close()
        if self.writer is not None:
            self.writer.close()


@ray.remote(max_concurrency=8)
class ReplicaActor:
    """A rollout replica; its decode loop runs in a thread so the manager can still ask for snapshots and
    hand it repack commands (applied by the loop between engine steps)."""

    def __init__(self, replica_id: int, make_engine: Any, scorer_factory: Any, **kw: Any) -> None:
        from laminar.rollout.replica import RolloutReplica

        self.replica = RolloutReplica(replica_id, make_engine, scorer=scorer_factory(), relay=None, **kw)

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def rank_pids(self) -> list[int]:
        """Every rank's process, this one (rank 0) first: one alone without tensor parallelism."""
        return list(getattr(self.replica.engine, "pids", [os.getpid()]))

    def start(self, relay: Any) -> None:
        self.replica.relay = relay
        self.replica.start()

    def set_relay(self, relay: Any) -> None:
        self.replica.relay = relay

    def stop(self) -> None:
        self.replica.stop()

    def snapshot(self) -> dict[str, Any]:
        return self.replica.snapshot()

    def export_requests(self, request_ids: list[str], with_kv: bool = False) -> list[Any]:
        return self.replica.export_requests(request_ids, with_kv=with_kv)

    def import_requests(self, items: list[Any]) -> list[str]:
        return self.replica.import_requests(items)


@ray.remote(max_concurrency=2)
class RankActor:
    """A following rank of a tensor-parallel replica (`laminar.rollout.tensor_parallel`): its shard of the engine,
    making rank 0's calls. Made by rank 0's actor, which owns it: it ends with rank 0."""

    def __init__(self, rank: int, world: int, make_engine: Any, cuda: bool, timeout_s: float, idle_s: float):
        self.rank, self.world, self.make_engine, self.cuda = rank, world, make_engine, cuda
        self.timeout_s, self.idle_s = timeout_s, idle_s

    def pid(self) -> int:
        return os.getpid()

    def run(self, address: tuple[str, int], torch_threads: int = 1) -> None:
        """Join the replica's ranks, build this rank's engine and follow rank 0 until the process ends."""
        import torch

        from laminar.relay.pull import SlotReader
        from laminar.rollout.tensor_parallel import follow, join_group

        torch.set_num_threads(torch_threads)
        try:
            if self.cuda:
                torch.cuda.set_device(0)  # Ray shows each rank its own GPU only
            tp, channel = join_group(self.rank, self.world, address, self.cuda, self.timeout_s, self.idle_s)
            engine = self.make_engine(tp)
        except (
            BaseException
        ):  # a rank that cannot start ends: rank 0's collectives break now, not at a timeout
            log.exception("rank %d of %d: could not start", self.rank, self.world)
            os._exit(1)
        follow(engine, channel, SlotReader(None, timeout=self.timeout_s))
