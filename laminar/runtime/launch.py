"""Starting the parts on a Ray cluster and the few operations every schedule is built from.

Placement (design section 3): the trainer where its resources are, the master relay on the trainer's node, one
relay on every node that hosts rollouts, chained master first; each replica pulls from its own node's relay.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from laminar.config import Config
from laminar.data.records import Trajectory
from laminar.manager.manager import RolloutFailure, RolloutManager
from laminar.relay.chain import build_chain, relay_on_node
from laminar.relay.relay import RelaySettings
from laminar.runtime.actors import BufferActor, PartialPoolActor, PromptPoolActor, ReplicaActor, TrainerActor
from laminar.schedules.schedule import Schedule
from laminar.telemetry.recorder import Recorder, dumps
from laminar.trainer.state_files import read_json, write_json


def on_driver_node(soft: bool = False) -> dict[str, Any]:
    """Actor options that place it on the driver's machine (soft: there if it fits, elsewhere if not)."""
    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=soft)}


def use_cuda(cfg: Config) -> bool:
    return cfg.model.device == "cuda" or (cfg.model.device == "auto" and torch.cuda.is_available())


def dataset_rows(cfg: Config) -> list[dict[str, Any]]:
    from laminar.data.dataset import load_jsonl
    from laminar.data.tasks import ReverseTask

    if cfg.task.name == "reverse":
        return ReverseTask(seed=cfg.task.seed).rows(cfg.task.num_prompts)
    if cfg.task.name == "lengths":
        from laminar.data.lengths import LengthWorkload

        t = cfg.task
        return LengthWorkload(
            median=t.length_median,
            p99_ratio=t.length_p99_ratio,
            lengths_file=t.lengths_file,
            max_len=cfg.rollout.max_new_tokens,
            seed=t.seed,
        ).rows(t.num_prompts)
    if cfg.task.name == "arith":
        from laminar.data.arith import ArithTask, parse_levels

        return ArithTask(parse_levels(cfg.task.arith_levels), seed=cfg.task.seed).rows(cfg.task.num_prompts)
    if Path(cfg.task.name).suffix == ".jsonl":
        return load_jsonl(cfg.task.name, required={"prompt": str})
    raise ValueError(f"task.name={cfg.task.name!r}: expected 'reverse' (built in) or a .jsonl file of rows")


def _node_of(_actor: Any) -> str:
    return ray.get_runtime_context().get_node_id()


def import_engine(_actor: Any) -> None:
    import laminar.engine.weights  # noqa: F401


class _EngineFactory:
    """Picklable recipe for a replica's engine, built inside the replica's process."""

    def __init__(self, model_path: str, cfg: Config, version: int = 0) -> None:
        self.model_path, self.cfg, self.version = model_path, cfg, version

    def __call__(self) -> Any:
        from laminar.engine import Engine

        r, cuda = self.cfg.rollout, use_cuda(self.cfg)
        dtype = torch.bfloat16 if cuda or self.cfg.model.dtype == "bfloat16" else torch.float32
        return Engine.from_pretrained(
            self.model_path,
            device="cuda" if cuda else "cpu",
            dtype=dtype,
            max_num_seqs=r.max_num_seqs,
            num_kv_blocks=r.kv_blocks,
            block_size=r.block_size,
            use_cuda_graphs=cuda,
            version=self.version,
        )


class _ScorerFactory:
    def __init__(self, model_path: str, reward: str, task: str, timeout_s: float | None = None) -> None:
        self.model_path, self.reward, self.task, self.timeout_s = model_path, reward, task, timeout_s

    def __call__(self) -> Any:
        from laminar.data.tasks import TaskCodec
        from laminar.rewards.loader import DEFAULT_REWARD, RewardScorer

        codec = TaskCodec.from_dir(self.model_path)
        default = {
            "lengths": "laminar.data.lengths:length_reward",
            "arith": "laminar.rewards.math:default_score",
        }.get(self.task, DEFAULT_REWARD)
        return RewardScorer(self.reward or default, codec.decode, timeout_s=self.timeout_s)


LOGS = ("metrics.jsonl", "trajectories.jsonl")  # append-only run logs, rewound to a checkpoint on resume


def log_sizes(run_dir: Path) -> dict[str, int]:
    """How long each run log is now: everything up to here belongs to the checkpoint being written."""
    return {name: (run_dir / name).stat().st_size if (run_dir / name).exists() else 0 for name in LOGS}


def finish_checkpoint_swap(checkpoint: Path) -> None:
    """A kill between the two renames of `Runtime.checkpoint` leaves only `checkpoint.old`: take it back."""
    old = checkpoint.with_name(checkpoint.name + ".old")
    if not checkpoint.exists() and old.exists():
        old.rename(checkpoint)


def rewind_to_checkpoint(run_dir: Path, checkpoint: Path) -> dict[str, int]:
    """Before a resume: the run logs end where the checkpoint was taken. What was logged after it (steps the
    resumed run trains again) moves to `NAME.rolled-back` beside the log, so nothing is counted twice and
    nothing is thrown away."""
    sizes = read_json(checkpoint / RUNTIME_STATE, "prompt pool, buffer and in-flight frontier").get(
        "logs", {}
    )
    moved = {}
    for name in LOGS:
        log, keep = run_dir / name, int(sizes.get(name, 0))
        if not log.exists() or log.stat().st_size <= keep:
            continue
        with open(log, "rb+") as f:
            f.seek(keep)
            tail = f.read()
            with open(run_dir / f"{name}.rolled-back", "ab") as dump:
                dump.write(tail)
            f.truncate(keep)
        moved[name] = len(tail)
    return moved


def _close_publisher(actor: Any) -> None:
    """Unlink the trainer's publish slots in /dev/shm (ray.kill gives a process no chance to)."""
    if actor.publisher is not None:
        actor.publisher.close()


def _check_finite(actor: Any) -> None:
    actor.trainer.check_finite()


RUNTIME_STATE = "runtime_state.json"  # the run's pools and counters beside the trainer's files


@dataclass
class Runtime:
    cfg: Config
    model_path: str
    recorder: Recorder
    prompt_pool: Any = None
    partial_pool: Any = None
    buffer: Any = None
    manager: Any = None
    trainer: Any = None
    relays: list[Any] = field(default_factory=list)  # the chain, master first
    relay_of_node: dict[str, Any] = field(default_factory=dict)
    relay_settings: RelaySettings | None = None
    replicas: dict[int, Any] = field(default_factory=dict)
    trained_ids: set[str] = field(default_factory=set)
    version: int = 0
    publish_times: dict[int, float] = field(default_factory=dict)
    engine_path: str = ""
    restarted_on_resume: int = 0
    trainer_spec: tuple[dict[str, Any], Any] | None = None
    last_checkpoint: Path | None = None
    since_checkpoint: list[list[list[Trajectory]]] = field(default_factory=list)  # batches to replay
    trainer_restarts: int = 0

    # ---- start ---------------------------------------------------------------------------------------------
    @classmethod
    def start(
        cls, cfg: Config, model_path: str, recorder: Recorder, schedule: Schedule, resume: Path | None = None
    ) -> Runtime:
        """Start every part; with `resume`, restore a checkpoint before any replica asks for work. If a part
        fails to start, the parts already started are stopped (their shared memory freed) and the error goes on."""
        rt = cls(cfg, model_path, recorder)
        try:
            return rt._start(schedule, resume)
        except BaseException:
            rt.shutdown()
            raise

    def _start(self, schedule: Schedule, resume: Path | None) -> Runtime:
        from laminar.data.tasks import TaskCodec
        from laminar.trainer.grpo import GRPOConfig
        from laminar.trainer.trainer import TrainerConfig as PlainTrainerConfig

        rt, cfg, model_path, recorder = self, self.cfg, self.model_path, self.recorder
        t, r, cuda = cfg.trainer, cfg.rollout, use_cuda(cfg)
        codec = TaskCodec.from_dir(model_path)
        # The control plane lives on the driver's machine: losing any other machine never takes it down.
        here = on_driver_node()
        rt.prompt_pool = PromptPoolActor.options(**here).remote(
            dataset_rows(cfg), codec.encode_prompt, t.group_size, seed=cfg.run.seed
        )
        rt.partial_pool = PartialPoolActor.options(**here).remote()
        rt.manager = (
            ray.remote(num_cpus=0)(RolloutManager)
            .options(**here)
            .remote(rt.prompt_pool, schedule.dispatch, recorder.t0)
        )
        rt.buffer = BufferActor.options(**here).remote(
            t.group_size,
            4 * cfg.buffer.capacity_groups * t.group_size,  # a hard bound well above the dispatch bound
            None if cfg.buffer.max_staleness < 0 else cfg.buffer.max_staleness,
            rt.prompt_pool,
            rt.manager,
            cfg.buffer.sampler,
        )
        grpo = GRPOConfig(
            clip_low=t.clip_low,
            clip_high=t.clip_high,
            temperature=r.temperature if r.temperature > 0 else 1.0,
            proximal="behaviour" if t.correction == "none" else "trainer",
            is_correction=t.correction,
            is_cap=t.is_cap,
        )
        plain = PlainTrainerConfig(
            model_path=model_path,
            lr=t.lr,
            weight_decay=t.weight_decay,
            grad_clip=t.max_grad_norm,
            micro_batch_size=t.micro_batch,
            seed=cfg.run.seed,
            threads=max(1, int(t.num_cpus)),
            grpo=grpo,
            device="cuda" if cuda else "cpu",
            publish_dtype="bfloat16" if cuda or cfg.model.dtype == "bfloat16" else "",
            max_nonfinite_steps=t.max_nonfinite_steps,
        )
        # The trainer (and so the master relay and the checkpoint writes) prefers the driver's machine too.
        resources = {"num_cpus": t.num_cpus, "num_gpus": t.num_gpus if cuda else 0}
        rt.trainer_spec = ({**resources, **on_driver_node(soft=True)}, plain)
        rt.trainer = TrainerActor.options(**rt.trainer_spec[0]).remote(plain, cfg.relay.slots)
        trainer_node = ray.get(rt.trainer.node_id.remote(), timeout=cfg.run.timeout_s)
        # One secret per run, handed to every relay through Ray: only this run's relays may feed the tier.
        rt.relay_settings = RelaySettings.for_run(
            cfg.relay.slots, int(cfg.relay.chunk_mb * (1 << 20)), tls=cfg.relay.tls
        )
        master = relay_on_node(trainer_node, "relay-master", rt.relay_settings)
        ray.get(rt.trainer.attach_master.remote(master), timeout=cfg.run.timeout_s)
        if resume is not None:
            rt.restore(resume)
            rt.engine_path = str(resume)  # the replicas start from the checkpoint's weights, at its version
        recorder.log(  # where this segment of the run starts, for `laminar audit`
            "segment",
            resumed_at=rt.version if resume is not None else None,
            group_size=t.group_size,
            issued_groups=ray.get(rt.prompt_pool.stats.remote(), timeout=cfg.run.timeout_s)["issued"],
        )

        sampling = {
            "temperature": r.temperature,
            "top_p": r.top_p,
            "top_k": r.top_k,
            "max_new_tokens": r.max_new_tokens,
        }
        spec = rt.replica_spec(sampling, interrupt_on_update=schedule.interrupt)
        for i in range(r.replicas):
            rt.replicas[i] = rt._new_replica(i, spec)
        nodes = ray.get([a.node_id.remote() for a in rt.replicas.values()], timeout=cfg.run.timeout_s)
        for node in dict.fromkeys(nodes):  # one relay per node that hosts rollouts, in first-seen order
            rt.relay_of_node[node] = relay_on_node(node, f"relay-{len(rt.relay_of_node)}", rt.relay_settings)
        rt.relays = [master, *rt.relay_of_node.values()]
        # Layouts are engine objects: import the engine in every relay now, not during the first publish.
        ray.get([r.__ray_call__.remote(import_engine) for r in rt.relays], timeout=cfg.run.timeout_s)
        build_chain(rt.relays, timeout=cfg.run.timeout_s)
        for actor, node in zip(rt.replicas.values(), nodes):
            ray.get(actor.start.remote(rt.relay_of_node[node]), timeout=cfg.run.timeout_s)
        repack = None
        if schedule.repack:
            repack = {
                "interval_s": cfg.repack.interval_s,
                "batch_limit_b": cfg.repack.batch_limit_b,
                "kv_capacity": cfg.repack.kv_capacity,
                "only_with_work": cfg.repack.only_with_work,
            }
        ray.get(
            rt.manager.configure.remote(
                rt.replicas,
                partial_pool=rt.partial_pool,
                buffer=rt.buffer,
                sampling=sampling,
                run_seed=cfg.run.seed,
                repack=repack,
                replica_spec=spec,
                relays=rt.relays,
                relay_settings=rt.relay_settings,
                relay_of_node=rt.relay_of_node,
                master_node=trainer_node,
                node_of_replica=dict(zip(rt.replicas, nodes)),
                heartbeat_s=r.heartbeat_s,
                dead_after_s=r.dead_after_s,
                timeout_s=cfg.run.timeout_s,
                max_failures_in_a_row=r.max_failures_in_a_row,
            ),
            timeout=cfg.run.timeout_s,
        )
        ray.get(rt.manager.start_background.remote(), timeout=cfg.run.timeout_s)
        return rt

    def replica_spec(self, sampling: dict[str, Any], interrupt_on_update: bool) -> dict[str, Any]:
        """How to make a replica; the manager uses it again to replace a dead one."""
        cfg, r = self.cfg, self.cfg.rollout
        return {
            "options": {
                "num_cpus": r.num_cpus,
                "num_gpus": r.num_gpus if use_cuda(cfg) else 0,
                **({"scheduling_strategy": "SPREAD"} if r.placement == "spread" else {}),
            },
            "args": (
                _EngineFactory(self.engine_path or self.model_path, cfg, self.version),
                _ScorerFactory(self.model_path, cfg.task.reward, cfg.task.name, cfg.task.reward_timeout_s),
            ),
            "kwargs": {
                "manager": self.manager,
                "partial_pool": self.partial_pool,
                "buffer": self.buffer,
                "sampling": sampling,
                "run_seed": cfg.run.seed,
                "progress_every": r.progress_every,
                "heartbeat_s": r.heartbeat_s,
                "timeout_s": cfg.run.timeout_s,
                "interrupt_on_update": interrupt_on_update,
            },
        }

    def _new_replica(self, i: int, spec: dict[str, Any]) -> Any:
        return ReplicaActor.options(**spec["options"]).remote(i, *spec["args"], **spec["kwargs"])

    # ---- the operations schedules are made of --------------------------------------------------------------
    def take(self, count: int, group_ids: range | None = None) -> list[list[Trajectory]]:
        """Complete groups from the experience buffer, waiting for them with the run's timeout: FIFO by
        completion, or exactly `group_ids` (a whole batch in dispatch order, for the bounded schedules)."""
        ids = None if group_ids is None else list(group_ids)
        ref = self.buffer.take.remote(count, self.version, self.cfg.run.timeout_s, ids)
        while not ray.wait([ref], timeout=1.0)[0]:  # meanwhile, once a second: are the rollouts still alive?
            self.check_rollouts()
        return ray.get(ref)

    def check_rollouts(self) -> None:
        """Bring the manager's records into the run log (the console shows errors as they come) and raise
        `RolloutFailure` if replicas keep failing the same way."""
        self.collect()
        fatal = ray.get(self.manager.fatal_error.remote(), timeout=self.cfg.run.timeout_s)
        if fatal is not None:
            raise RolloutFailure(fatal)

    def train(self, groups: list[list[Trajectory]], push: bool = False) -> dict[str, Any]:
        """One trainer step plus its publish; logs the step and tells the manager. `push` makes the publish a
        global push: the step ends only when every relay holds the new version (the baselines' broadcast)."""
        try:
            m = ray.get(self.trainer.step.remote(groups), timeout=self.cfg.run.timeout_s * 5)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            self._restart_trainer()
            m = ray.get(self.trainer.step.remote(groups), timeout=self.cfg.run.timeout_s * 5)
        # The step is committed by the last line below (`self.version = v`): an interrupt anywhere before it
        # leaves the run's record one version behind the trainer, and `checkpoint` refuses to write that.
        v = m["version"]
        self.since_checkpoint.append(groups)
        self.buffer.trained.remote([g[0].group_id for g in groups])
        chain = ray.get(self.manager.chain.remote(), timeout=self.cfg.run.timeout_s)
        if chain and chain[0]._actor_id != self.relays[0]._actor_id:  # the master relay was replaced
            ray.get(self.trainer.attach_master.remote(chain[0]), timeout=self.cfg.run.timeout_s)
        self.relays = chain or self.relays
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
        self.manager.trainer_update.remote(v, len(groups))
        if self.cfg.run.save_trajectories:
            self._save_trajectories(groups, v)
        rec = self.recorder
        rec.log("publish", t=m["t_publish"], version=v, stall_s=m["stall_s"])
        traj_ids = m.pop("traj_ids")
        rec.log("step", step=v, **{k: x for k, x in m.items() if k not in ("t_start", "t_publish")})
        self.trained_ids.update(traj_ids)
        self.version = v
        self.collect()
        return m

    def _save_trajectories(self, groups: list[list[Trajectory]], version: int) -> None:
        """What was trained, as data: `trajectories.jsonl` in the run folder (one line per trajectory)."""
        with open(self.recorder.out_dir / "trajectories.jsonl", "a") as f:
            for t in (t for g in groups for t in g):
                row = {
                    "traj_id": t.traj_id,
                    "group_id": t.group_id,
                    "version": t.version,
                    "trained_at": version,
                    "replica": t.replica,
                    "reward": t.reward,
                    "finish_reason": t.finish_reason,
                    "prompt_ids": t.prompt_ids,
                    "response_ids": t.response_ids,
                }
                f.write(dumps(row) + "\n")  # strict JSON, as every file of the run

    def collect(self) -> None:
        """Pull the manager's replica timeline and events into the run log."""
        timeline, events = ray.get(self.manager.drain_records.remote(), timeout=self.cfg.run.timeout_s)
        for row in timeline:
            self.recorder.log("replica", t=row.pop("t") + self.recorder.t0, **row)
        for ev in events:
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

    def stop(self) -> dict[str, Any]:
        # A batch taken for a step that never finished (Ctrl-C) goes back to the buffer before anything is
        # recorded or checkpointed.
        returned = ray.get(self.buffer.return_lent.remote(), timeout=self.cfg.run.timeout_s)
        if returned:
            self.recorder.log("returned_to_buffer", groups=returned)
        report = ray.get(self.manager.stop.remote(), timeout=self.cfg.run.timeout_s)
        self.replicas = ray.get(self.manager.live_replicas.remote(), timeout=self.cfg.run.timeout_s)
        self.relays = ray.get(self.manager.chain.remote(), timeout=self.cfg.run.timeout_s)
        for rid, ref in [(rid, a.stop.remote()) for rid, a in self.replicas.items()]:
            try:
                ray.get(ref, timeout=self.cfg.run.timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                self.recorder.log("stop_error", error=f"replica {rid} died before it could stop")
        self.collect()
        t = self.cfg.run.timeout_s
        buf = ray.get(self.buffer.stats.remote(), timeout=t)
        inflight = ray.get(self.partial_pool.stats.remote(), timeout=t)
        held, dropped = ray.get(self.buffer.held_ids.remote(), timeout=t)
        self.recorder.log(  # what this segment leaves behind, for `laminar audit`
            "end",
            issued_groups=ray.get(self.prompt_pool.stats.remote(), timeout=t)["issued"],
            queued_groups=ray.get(self.prompt_pool.queued_group_ids.remote(), timeout=t),
            in_flight=sorted(self._running()),
            held=sorted(held),
            dropped=dropped,
        )
        return {"buffer": buf, "partial": inflight, **report}

    def _running(self) -> set[str]:
        """Ids the (stopped) replicas still hold: work the partial pool lists but no replica runs is not in
        flight, it is lost, and the audit must say so."""
        running: set[str] = set()
        for actor in self.replicas.values():
            try:
                running.update(ray.get(actor.snapshot.remote(), timeout=self.cfg.run.timeout_s)["inflight"])
            except ray.exceptions.RayError:
                continue  # died at the very end: what it held is not in flight anywhere
        return running

    def _restart_trainer(self) -> None:
        """The trainer died: a new one loads the last checkpoint and trains again on every batch consumed since
        (the driver kept them), so it stands where the dead one stood; the rollouts never stopped meanwhile."""
        t = self.cfg.run.timeout_s
        self.trainer_restarts += 1
        self.recorder.log("failure", what="trainer", version=self.version)
        options, plain = self.trainer_spec
        self.trainer = TrainerActor.options(**options).remote(plain, self.cfg.relay.slots)
        node = ray.get(self.trainer.node_id.remote(), timeout=t)
        master = self.relays[0]
        try:
            same_node = ray.get(master.__ray_call__.remote(_node_of), timeout=t) == node
        except ray.exceptions.RayError:
            same_node = False  # the master died with the trainer's machine
        if not same_node:  # the publisher maps the master's slots: a new master beside the new trainer
            self.relays = ray.get(self.manager.move_master.remote(node), timeout=t * 2)
            master = self.relays[0]
        ray.get(self.trainer.attach_master.remote(master), timeout=t)
        if self.last_checkpoint is not None:
            ray.get(self.trainer.load_checkpoint.remote(str(self.last_checkpoint)), timeout=t * 5)
        for batch in self.since_checkpoint:
            ray.get(self.trainer.replay.remote(batch), timeout=t * 5)
        caught_up = ray.get(self.trainer.version.remote(), timeout=t)
        if caught_up != self.version:
            raise RuntimeError(
                f"the restarted trainer is at version {caught_up} after replay, expected {self.version}"
            )

    def checkpoint(self, path: Path) -> None:
        """Trainer state, then the prompt pool, the in-flight frontier and the buffer, in that order: a group
        issued or a trajectory finished between two snapshots is then regenerated on resume and deduplicated
        by the buffer, never lost. Written beside `path` and swapped in, so a crash never leaves half of one."""
        tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
        shutil.rmtree(tmp, ignore_errors=True)
        t = self.cfg.run.timeout_s
        ray.get(self.trainer.__ray_call__.remote(_check_finite), timeout=t)  # never save NaN weights
        ray.get(self.trainer.save_checkpoint.remote(str(tmp)), timeout=t * 5)
        saved = ray.get(self.trainer.version.remote(), timeout=t)
        if saved != self.version:  # interrupted between the trainer's step and our record of it
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(
                f"checkpoint skipped: the trainer is at version {saved} but the run recorded {self.version}; "
                f"{path} keeps the last consistent checkpoint"
            )
        state = {
            "version": self.version,
            "logs": log_sizes(self.recorder.out_dir),
            "prompt_pool": ray.get(self.prompt_pool.state_dict.remote(), timeout=t),
            "partial_pool": ray.get(self.partial_pool.snapshot.remote(), timeout=t),
            "buffer": ray.get(self.buffer.state_dict.remote(), timeout=t),
            "trained_ids": sorted(self.trained_ids),
        }
        write_json(tmp / RUNTIME_STATE, state)
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
        self.last_checkpoint, self.since_checkpoint = path, []

    def restore(self, path: Path) -> None:
        t = self.cfg.run.timeout_s
        self.version = ray.get(self.trainer.load_checkpoint.remote(str(path)), timeout=t * 5)
        state = read_json(path / RUNTIME_STATE, "prompt pool, buffer and in-flight frontier")
        ray.get(self.prompt_pool.load_state_dict.remote(state["prompt_pool"]), timeout=t)
        ray.get(self.buffer.load_state_dict.remote(state["buffer"]), timeout=t)
        # In-flight work was generated by versions whose weights are gone: its groups are issued again; a group
        # the buffer holds samples of keeps them only if the new ones come from the same version (a group is
        # trained at one version, so a newer sample replaces its group's older ones).
        self.restarted_on_resume = len(state["partial_pool"]["entries"])
        ray.get(self.prompt_pool.reissue_outstanding.remote(), timeout=t)
        self.trained_ids = set(state["trained_ids"])
        ray.get(self.manager.trainer_update.remote(self.version, 0), timeout=t)

    def shutdown(self) -> None:
        """Free every actor and the relays' and the trainer's shared memory (a process may run several runtimes
        in a row)."""
        if self.trainer is not None:
            try:
                ray.get(self.trainer.__ray_call__.remote(_close_publisher), timeout=10)
            except ray.exceptions.RayError:
                pass  # dead: its slots are swept at the next run's start on this node
        for relay in self.relays:
            try:
                ray.get(relay.shutdown.remote(), timeout=10)
            except ray.exceptions.RayError:
                pass  # already dead; its node's /dev/shm is swept by the next relay there
        actors = [
            self.trainer,
            self.manager,
            self.buffer,
            self.prompt_pool,
            self.partial_pool,
            *self.relays,
            *self.replicas.values(),
        ]
        for actor in actors:
            if actor is not None:
                ray.kill(actor)
