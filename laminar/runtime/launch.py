"""The run as the driver holds it (`Runtime`) and the few operations every schedule is built from: take complete
groups, train on them and publish, look after the rollouts and the control actors. Starting, stopping and
restarting the parts is `lifetime.py`, mixed into `Runtime`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from laminar.config import Config
from laminar.data.records import Trajectory
from laminar.manager.manager import RolloutFailure
from laminar.relay.relay import RelaySettings
from laminar.rewards.stop import FailingRewards
from laminar.runtime.control import process_id
from laminar.runtime.evaluation import Evaluator
from laminar.runtime.lifetime import CONTROL, JOURNAL, Lifetime
from laminar.telemetry.recorder import Recorder, write_trajectories
from laminar.telemetry.samples import due, sample_rows
from laminar.trainer.grpo import informative


@dataclass
class Batch:
    """What one `take` hands the step that trains on it."""

    groups: list[list[Trajectory]]  # the groups the step trains on
    t_taken: float  # when the last of them came from the buffer
    # set aside by filter_groups: consumed, untrained
    filtered: list[list[Trajectory]] = field(default_factory=list)
    consumed_early: int = 0  # of the batch's groups, those the manager was already told were consumed


@dataclass
class Runtime(Lifetime):
    cfg: Config
    model_path: str
    recorder: Recorder
    prompt_pool: Any = None
    partial_pool: Any = None
    buffer: Any = None
    manager: Any = None
    trainer: Any = None
    relays: list[Any] = field(default_factory=list)  # the chain, master first
    relay_settings: RelaySettings | None = None
    replicas: dict[int, Any] = field(default_factory=dict)
    trained_ids: set[str] = field(default_factory=set)
    version: int = 0
    publish_times: dict[int, float] = field(default_factory=dict)
    restarted_on_resume: int = 0
    trainer_spec: tuple[dict[str, Any], Any] | None = None
    last_checkpoint: Path | None = None
    since_checkpoint: list[list[list[Trajectory]]] = field(default_factory=list)  # batches to replay
    evaluator: Evaluator | None = None
    end_ids: tuple[int, ...] = ()  # every token that ends a response: the model's, the tokenizer's, the run's
    failing_rewards: FailingRewards = field(default_factory=lambda: FailingRewards(0))  # the stop rule
    namespace: str = ""  # the run's Ray namespace: its replicas and relays, by name
    takes: int = 0  # requests to the buffer so far: a take retried after the buffer's loss is the same take
    consumed: int = 0  # groups the trainer consumed in this segment (the manager's dispatch bound)
    events_logged: int = 0  # the manager's events in the run log so far
    control_pids: dict[str, int] = field(default_factory=dict)  # each control actor's process, last seen
    codec: Any = None  # the model's tokenizer: the text `trajectories.jsonl` and `samples.jsonl` keep

    # ---- start ---------------------------------------------------------------------------------------------
    # ---- the operations schedules are made of --------------------------------------------------------------
    def take(self, count: int, group_ids: range | None = None) -> Batch:
        """Complete groups from the experience buffer, waiting for them with the run's timeout: FIFO by
        completion, or exactly `group_ids` (a whole batch in dispatch order, for the bounded schedules).

        With `trainer.filter_groups` (DAPO's dynamic sampling) a group whose rewards are all equal is set aside
        and the step is filled from the buffer again, until `count` groups carry a signal or
        `trainer.filter_take_limit` x `count` groups were taken; then the step trains on what there is (all of
        the last `count` taken if none differ), and a `filter_short` record says so. A batch in dispatch order
        is filtered but not refilled: the dispatch bound fixes its groups."""
        groups, t_taken = self._take(count, group_ids)
        batch = Batch(groups, t_taken)
        if not self.cfg.trainer.filter_groups:
            return batch
        kept, taken, limit = [], 0, self.cfg.trainer.filter_take_limit * count
        while True:
            taken += len(groups)
            dropped = [g for g in groups if not informative([t.reward for t in g])]
            kept += [g for g in groups if informative([t.reward for t in g])]
            if dropped:  # consumed now, so the dispatch bound makes room for the groups that replace them
                batch.filtered += dropped
                batch.consumed_early += len(dropped)
                self.consumed += len(dropped)
                self.manager.trainer_update.remote(self.version, self.consumed)
            if len(kept) >= count or group_ids is not None or taken >= limit:
                break
            groups, batch.t_taken = self._take(min(count - len(kept), limit - taken))
        if len(kept) < count:
            self.recorder.log(
                "filter_short",
                step=self.version + 1,
                kept=len(kept),
                wanted=count,
                taken=taken,
                why="trainer.filter_take_limit" if group_ids is None else "a batch in dispatch order",
            )
            if not kept:
                kept, batch.filtered = batch.filtered[-count:], batch.filtered[:-count]
        batch.groups = kept
        return batch

    def _take(self, count: int, group_ids: range | None = None) -> tuple[list[list[Trajectory]], float]:
        """`count` groups from the buffer (these ids, with `group_ids`) and when they came."""
        ids = None if group_ids is None else list(group_ids)
        self.takes += 1
        ref = self.buffer.take.remote(count, self.version, self.cfg.run.timeout_s, ids, self.takes)
        while not ray.wait([ref], timeout=1.0)[0]:  # meanwhile, once a second: are the rollouts still alive?
            self.check_rollouts()
            self.follow_master()
            if self.evaluator is not None:
                self.evaluator.poll()
        groups = ray.get(ref)
        t_taken = time.time()
        self.failing_rewards.see(groups)  # raises RewardFailure before a step trains on nothing but failures
        return groups, t_taken

    def follow_master(self) -> None:
        """Take the manager's relay chain as it stands. After it replaced a dead master relay: publish into the
        new one from now on, and publish the current version there again at once. The dead master may have
        taken the newest version with it, and with `schedule.max_lag` 0 no replica behind the trainer gets new
        work until that version is out: waiting for the next step's publish could wait forever, since that step
        needs their groups."""
        t = self.cfg.run.timeout_s
        master, chain = ray.get(self.manager.head_and_chain.remote(), timeout=t)
        if master is None or master._actor_id == self.relays[0]._actor_id:
            self.relays = chain or self.relays
            return
        self.trainer.call("attach_master", master, timeout=t)
        self.trainer.call("republish", timeout=t)
        self.relays = chain
        self.recorder.log("republish", version=self.version, why="a new master relay")

    def check_rollouts(self) -> None:
        """Bring the manager's records into the run log (the console shows errors as they come) and raise
        `RolloutFailure` if replicas keep failing the same way, or if a control actor is dead for good (Ray
        could not restart it: the rollouts would wait for work that never comes until the buffer's timeout)."""
        self.check_control()
        self.collect()
        fatal = ray.get(self.manager.fatal_error.remote(), timeout=self.cfg.run.timeout_s)
        if fatal is not None:
            raise RolloutFailure(fatal)

    def check_control(self) -> None:
        """Ask each control actor for its process: one that Ray restarted since the last look (it was lost, and
        its restarted self replayed its journal) is a `failure` record; one that cannot answer is the end."""
        for name in CONTROL:
            try:
                pid = ray.get(
                    getattr(self, name).__ray_call__.remote(process_id), timeout=self.cfg.run.timeout_s
                )
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                raise RolloutFailure(
                    f"the {name.replace('_', ' ')} died and could not be restarted ({type(e).__name__}; its "
                    f"journal is in RUN_DIR/{JOURNAL}); the last checkpoint is consistent: continue with "
                    "laminar train --resume RUN_DIR"
                ) from e
            if self.control_pids.setdefault(name, pid) != pid:
                self.control_pids[name] = pid
                self.recorder.log("failure", what=name, replaced=True, version=self.version)

    def train(self, batch: Batch, push: bool = False) -> dict[str, Any]:
        """One trainer step on `batch` plus its publish; logs the step and tells the manager. `push` makes the
        publish a global push: the step ends only when every relay holds the new version (the baselines'
        broadcast)."""
        groups, filtered = batch.groups, batch.filtered
        try:
            m = self.trainer.call("step", groups, timeout=self.cfg.run.timeout_s * 5)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            self._restart_trainer()
            m = self.trainer.call("step", groups, timeout=self.cfg.run.timeout_s * 5)
        # The step is committed by the last line below (`self.version = v`): an interrupt anywhere before it
        # leaves the run's record one version behind the trainer, and `checkpoint` refuses to write that.
        v = m["version"]
        self.since_checkpoint.append(groups)
        self.buffer.trained.remote([g[0].group_id for g in groups + filtered])
        self.follow_master()  # and the chain as it stands (a relay may have died meanwhile)
        self.publish_times[v] = m["t_publish"]
        if push:
            t = time.time()
            try:
                ray.get(
                    [r.wait_version.remote(v, self.cfg.run.timeout_s) for r in self.relays[1:]],
                    timeout=self.cfg.run.timeout_s,
                )
            except (
                ray.exceptions.RayActorError,
                ray.exceptions.ActorUnavailableError,
            ):  # a relay died: the manager rebuilt the chain
                self.relays = ray.get(self.manager.chain.remote(), timeout=self.cfg.run.timeout_s)
            m["stall_s"] += time.time() - t
        self.consumed += len(groups) + len(filtered) - batch.consumed_early
        self.manager.trainer_update.remote(v, self.consumed)
        if self.cfg.run.save_trajectories:
            write_trajectories(self.recorder.out_dir, groups, v, filtered, self.codec.response_text)
        rec = self.recorder
        rec.log("publish", t=m["t_publish"], version=v, stall_s=m["stall_s"])
        traj_ids = m.pop("traj_ids")
        if self.cfg.trainer.filter_groups:  # consumed without training: the audit counts them apart
            m["filtered_groups"] = len(filtered)
            m["filtered_ids"] = [t.traj_id for g in filtered for t in g]
        # where a step's time goes between its last sample and its update
        t_gen_end = max((t.t_end for g in groups for t in g), default=m["t_start"])
        # scoring, buffer, transfer to the driver; then the batch's way to the trainer
        m["scored_to_taken_s"] = round(batch.t_taken - t_gen_end, 4)
        m["taken_to_trainer_s"] = round(m["t_start"] - batch.t_taken, 4)
        rec.log("step", step=v, **{k: x for k, x in m.items() if k not in ("t_start", "t_publish")})
        if due(self.cfg.run.samples_every, v):
            rec.samples(v, sample_rows(groups, v, self.cfg.run.samples_per_step, self.codec))
        self.trained_ids.update(traj_ids)
        self.version = v
        self.collect()
        if self.evaluator is not None:
            if self.evaluator.due(v):
                self.evaluator.submit(v)
            self.evaluator.poll()
        return m

    def collect(self) -> None:
        """Pull the manager's replica timeline and events into the run log. The manager keeps each event until
        the next call says it is logged, so events it sent in an answer lost with it come again."""
        timeline, first, events = ray.get(
            self.manager.drain_records.remote(self.events_logged), timeout=self.cfg.run.timeout_s
        )
        logged, self.events_logged = self.events_logged, max(self.events_logged, first + len(events))
        for row in timeline:
            self.recorder.log("replica", t=row.pop("t") + self.recorder.t0, **row)
        for ev in events[max(0, logged - first) :]:  # numbered from `first`: none is logged twice
            kind = ev.pop("kind")
            self.recorder.log(kind, t=ev.pop("t") + self.recorder.t0, **ev)

    def propagation(self) -> dict[int, float]:
        """Per version: publish -> complete at the last relay of the chain."""
        stats = []
        for relay in self.relays:
            try:
                stats.append(ray.get(relay.stats.remote(), timeout=self.cfg.run.timeout_s))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                continue  # died after the manager's last look; the others still tell the story
        out = {}
        for v, t_pub in self.publish_times.items():
            done = [s["versions"].get(v, {}).get("t_complete") for s in stats]
            if all(done):
                out[v] = max(done) - t_pub
        return out
