"""Thin Ray actor wrappers around the plain components, so every process boundary is a Ray actor and every part
stays testable without Ray. Each wrapper adds only what crossing a process boundary needs: waiting with a
timeout, and telling the other parts what happened."""

from __future__ import annotations

import logging
import os
import threading
import time
from functools import partial
from typing import Any

import ray

from laminar.data.experience_buffer import ExperienceBuffer
from laminar.data.partial_pool import PartialPool
from laminar.data.prompt_pool import PromptPool
from laminar.data.records import Trajectory
from laminar.data.staleness import staleness

log = logging.getLogger(__name__)


def _exactly(wanted: set[int], ready: list, count: int, version: int) -> list[int]:
    return [i for i, g in enumerate(ready) if g[0].group_id in wanted]


@ray.remote(num_cpus=0, max_concurrency=16)
class BufferActor:
    """The experience buffer; `take` blocks (with a timeout) until enough complete groups are ready."""

    def __init__(
        self,
        group_size: int,
        capacity: int,
        max_staleness: int | None,
        prompt_pool: Any,
        manager: Any,
        sampler: str = "fifo",
    ) -> None:
        self.buffer = ExperienceBuffer(
            group_size, capacity=capacity, max_staleness=max_staleness, sampler=sampler
        )
        self.prompt_pool, self.manager = prompt_pool, manager
        self.cond = threading.Condition()
        # Groups handed to the driver and not yet trained: a driver interrupted between `take` and the end of
        # its step (Ctrl-C) must not lose them, so they stay here until `trained` and go back on `return_lent`.
        self.lent: dict[int, list[Trajectory]] = {}
        self.lending = True
        self.evaluated: dict[
            int, list[Trajectory]
        ] = {}  # evaluation groups' samples, by group (never trained)

    def add_eval_many(self, trajs: list[Trajectory]) -> None:
        """Samples of evaluation groups: kept aside for the driver's evaluator, never in the buffer."""
        for traj in trajs:
            self.evaluated.setdefault(traj.group_id, []).append(traj)

    def take_eval(self, group_ids: list[int]) -> dict[int, list[Trajectory]]:
        """The evaluation samples that have arrived for `group_ids` (each group once it is whole or partly)."""
        return {g: self.evaluated.pop(g) for g in group_ids if g in self.evaluated}

    def add_many(self, trajs: list[Trajectory]) -> list[bool]:
        """Several trajectories in one call (a replica sends all it has scored at once); per trajectory, False
        if it was ignored (`ExperienceBuffer.add`)."""
        added, complete = [], []
        with self.cond:
            for traj in trajs:
                added.append(self.buffer.add(traj))
                if added[-1] and traj.group_id not in self.buffer.pending:
                    complete.append(traj)
            self.cond.notify_all()
        for traj in complete:  # the group is whole: nobody needs to re-issue it any more
            self.prompt_pool.done.remote(traj.group_id)
            self.manager.group_done.remote(traj.replica, traj.group_id)
        return added

    def take(
        self,
        count: int,
        version: int,
        timeout_s: float,
        group_ids: list[int] | None = None,
    ) -> list[list[Trajectory]]:
        """`count` complete groups: the buffer's sampler (`buffer.sampler`), or exactly `group_ids` (in dispatch
        order)."""
        deadline = time.monotonic() + timeout_s
        sampler = self.buffer.sampler
        if group_ids is not None:
            sampler = partial(_exactly, set(group_ids))
        with self.cond:
            while (groups := self._sample(sampler, count, version)) is None:
                if not self.lending:
                    return []
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"experience buffer: {count} complete groups did not arrive within {timeout_s:.0f}s "
                        f"(ready {self.buffer.num_ready()}, pending {len(self.buffer.pending)}); are the rollouts "
                        "alive? see their errors in metrics.jsonl"
                    )
                self.cond.wait(left)
            if not self.lending:  # stopped while we waited: they stay in the buffer
                self.buffer.ready[:0] = groups
                return []
            for g in groups:
                self.lent[g[0].group_id] = g
            return groups

    def trained(self, group_ids: list[int]) -> None:
        """The driver trained on these: they are no longer the buffer's to give back."""
        with self.cond:
            for gid in group_ids:
                self.lent.pop(gid, None)

    def return_lent(self) -> int:
        """Stop lending and put every group handed out but not trained back at the front, in order."""
        with self.cond:
            self.lending = False
            back = list(self.lent.values())
            self.buffer.ready[:0] = back
            self.lent.clear()
            self.cond.notify_all()
            return len(back)

    def _sample(self, sampler, count: int, version: int) -> list[list[Trajectory]] | None:
        ready = sampler(self.buffer.ready, count, version)
        if len(ready) < count:
            return None
        default, self.buffer.sampler = self.buffer.sampler, sampler
        try:
            return self.buffer.sample(count, version)
        finally:
            self.buffer.sampler = default

    def group_state(self, group_id: int, traj_ids: list[str]) -> tuple[list[str], set[int]]:
        """Which of a group's ids the buffer has (or had), and the versions it holds them at (recovery)."""
        with self.cond:
            return self.buffer.group_state(group_id, traj_ids)

    def restart_group(self, group_id: int, traj_ids: list[str], version: int) -> bool:
        with self.cond:
            return self.buffer.restart_group(group_id, traj_ids, version)

    def num_ready(self) -> int:
        return self.buffer.num_ready()

    def stats(self) -> dict[str, Any]:
        with self.cond:
            return self.buffer.stats()

    def held_ids(self) -> tuple[set[str], dict[str, str]]:
        """The ids held now, and those dropped with the reason (the audit's end record)."""
        with self.cond:
            return self.buffer.held_ids(), dict(self.buffer.dropped)

    def state_dict(self) -> dict[str, Any]:
        with self.cond:
            return self.buffer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resume: the restored buffer, with no group held to a version of the stopped run (`resumed`)."""
        with self.cond:
            self.buffer.load_state_dict(state)
            self.buffer.resumed()


PromptPoolActor = ray.remote(num_cpus=0)(PromptPool)
PartialPoolActor = ray.remote(num_cpus=0)(PartialPool)


@ray.remote(max_concurrency=4)
class TrainerActor:
    """One rank of the trainer plus its share of the weight publish: each step trains, then copies the new
    version into shared memory for the master relay and returns (the publish is the trainer's only stall).
    With one rank (`world=1`) it holds the whole model and publishes it; with several, each rank is one FSDP
    shard (`join` first), writes its own rows into rank 0's publish slot, and rank 0 hands the slot over. A rank
    on another machine than rank 0 (`trainer.placement=spread`) sends its rows to the master relay instead
    (`Relay.piece`), which assembles the version from the slot and the pieces before anyone may pull it."""

    def __init__(self, trainer_cfg: Any, slots: int, rank: int = 0, world: int = 1) -> None:
        self.cfg, self.slots, self.rank, self.world = trainer_cfg, slots, rank, world
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

        self.trainer = Trainer(self.cfg)

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

        cuda = self.cfg.device.startswith("cuda")
        if cuda:
            torch.cuda.set_device(0)  # Ray shows each rank its own GPU only
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world,
        )
        self.trainer = Trainer(self.cfg, rank=self.rank, world=self.world)
        self.writer = ShardWriter()
        nodes: list[Any] = [None] * self.world
        dist.all_gather_object(nodes, self.node_id())
        self.remote = nodes[self.rank] != nodes[0]
        self.remote_ranks = sum(n != nodes[0] for n in nodes)

    def attach_master(self, master: Any) -> None:
        from laminar.relay.publisher import WeightPublisher

        self.master = master
        if self.rank != 0:
            return
        if self.publisher is None:
            self.publisher = WeightPublisher(master, num_slots=self.slots)
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

        from laminar.engine.weights import WeightLayout

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
