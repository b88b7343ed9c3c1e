"""The run's parts over their lifetime on a Ray cluster: started in their places (design section 3: the trainer
where its resources are, the master relay on the trainer's node, one relay on every node that hosts rollouts,
chained master first; each replica pulls from its own node's relay), the trainer restarted from its checkpoint
when it is lost, stopped with what the run leaves behind recorded, and shut down."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Self

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from laminar.config import Config
from laminar.data.dataset import val_rows
from laminar.manager.manager import RolloutManager
from laminar.manager.spec import ManagerSpec
from laminar.relay.relay import RelaySettings
from laminar.rewards.stop import FailingRewards
from laminar.runtime.checkpoint import replica_weights, restore_checkpoint, write_checkpoint
from laminar.runtime.control import RESTARTS, MadeHere, PartialPoolActor, PromptPoolActor, rows_digest
from laminar.runtime.evaluation import Evaluator
from laminar.runtime.factory import BUFFER, Factory, ReplicaSpec, run_namespace, sweep, use_cuda
from laminar.runtime.journaled_buffer import BufferActor
from laminar.runtime.trainer_group import TrainerGroup, trainer_args
from laminar.schedules.schedule import Schedule
from laminar.tasks.rows import held_out_rows, train_rows
from laminar.telemetry.recorder import Recorder

# Loading the policy may take this many `run.timeout_s` (a large model from a slow disk, sharded over ranks).
LOAD_TIMEOUT_FACTOR = 5


JOURNAL = "journal"  # the control actors' journals, in the run folder (`laminar.journal`)
CONTROL = ("prompt_pool", "partial_pool", "buffer", "manager")  # restarted by Ray when lost


def on_driver_node(soft: bool = False) -> dict[str, Any]:
    """Actor options that place it on the driver's machine (soft: there if it fits, elsewhere if not)."""
    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=soft)}


def eval_rows(cfg: Config) -> list[dict[str, Any]]:
    """The held-out set: `data.val_files`, else the built-in task's held-out split (rows never drawn for
    training), else none."""
    return val_rows(cfg) if cfg.data.val_files else held_out_rows(cfg)


def _node_of(_actor: Any) -> str:
    return ray.get_runtime_context().get_node_id()


class Lifetime:
    """`Runtime`'s start, trainer restarts, stop, checkpoints and shutdown."""

    @classmethod
    def start(
        cls, cfg: Config, model_path: str, recorder: Recorder, schedule: Schedule, resume: Path | None = None
    ) -> Self:
        """Start every part; with `resume`, restore a checkpoint before any replica asks for work. If a part
        fails to start, the parts already started are stopped (their shared memory freed) and the error goes on."""
        rt = cls(cfg, model_path, recorder)
        try:
            return rt._start(schedule, resume)
        except BaseException:
            rt.shutdown()
            raise

    def _start(self, schedule: Schedule, resume: Path | None) -> Self:
        from laminar.data.codec import TaskCodec

        rt, cfg, model_path, recorder = self, self.cfg, self.model_path, self.recorder
        t, r, cuda = cfg.trainer, cfg.rollout, use_cuda(cfg)
        codec = TaskCodec.from_config(model_path, cfg)
        rt.end_ids, rt.codec = codec.end_ids, codec
        rt.failing_rewards = FailingRewards(cfg.task.reward_fail_groups)
        # The control plane lives on the driver's machine: losing any other machine never takes it down. Its
        # actors journal into the run folder, and Ray restarts one that is lost; the replicas and relays live in
        # the run's namespace, where a stopped segment's leftovers are ended first.
        recorder.log("phase", what="placing the prompt pool, experience buffer and manager")
        here = on_driver_node()
        rt.namespace = run_namespace(recorder.out_dir)
        sweep(rt.namespace)
        journal = recorder.out_dir / JOURNAL
        shutil.rmtree(journal, ignore_errors=True)  # a segment's journals start with it
        # The pool reads the rows itself, as does its restarted self (`MadeHere`): a dataset passed whole would
        # live in the object store for the run. The encoder travels made (loading a tokenizer loads torch), and
        # without transformers where the tokenizer has no chat template (checked on the first rows).
        rows = train_rows(cfg)
        encode = codec.plain_prompt_encoder(row["prompt"] for row in rows[:32]) or codec.encode_prompt
        rt.prompt_pool = PromptPoolActor.options(**here).remote(
            MadeHere(train_rows, (cfg,)), encode, t.group_size, cfg.run.seed, str(journal), rows_digest(rows)
        )
        rt.partial_pool = PartialPoolActor.options(**here).remote(str(journal))
        # One secret per run, handed to every relay through Ray: only this run's relays may feed the tier.
        rt.relay_settings = RelaySettings.for_run(
            cfg.relay.slots, int(cfg.relay.chunk_mb * (1 << 20)), tls=cfg.relay.tls
        )
        spec = ReplicaSpec.of(cfg)
        factory = Factory(
            spec,
            model_path,
            rt.relay_settings,
            partial_pool=rt.partial_pool,
            interrupt_on_update=schedule.interrupt,
            namespace=rt.namespace,
            end_ids=codec.end_ids,
            tokenizer_class=codec.tokenizer_class,
            decoder=codec.plain_decoder(),
            tool_renderer=codec.plain_tool_renderer() if spec.tools is not None else None,
            # a resumed run's replicas start from the checkpoint's weights, at its version
            **(replica_weights(cfg.trainer.publishes_adapters, resume) if resume else {}),
        )
        rt.manager = (
            ray.remote(num_cpus=0, **RESTARTS)(RolloutManager)
            .options(**here)
            .remote(
                ManagerSpec.of(cfg),
                schedule,
                rt.prompt_pool,
                rt.partial_pool,
                recorder.t0,
                factory,
                str(journal),
            )
        )
        rt.buffer = BufferActor.options(**here, name=BUFFER, namespace=rt.namespace).remote(
            t.group_size,
            4 * cfg.buffer.capacity_groups * t.group_size,  # a hard bound well above the dispatch bound
            cfg.buffer.max_staleness,
            rt.prompt_pool,
            rt.manager,
            cfg.buffer.sampler,
            str(journal),
        )
        plain = trainer_args(cfg, model_path, cuda)
        # The trainer (and so the master relay and the checkpoint writes) prefers the driver's machine too.
        resources = {"num_cpus": t.num_cpus, "num_gpus": t.num_gpus if cuda else 0}
        rt.trainer_spec = (resources, plain)
        recorder.log(
            "phase",
            what="starting the trainer (it loads the policy"
            + (" and the KL reference" if t.kl_coef else "")
            + " while the rollouts start)",
        )
        # The policy loads in the background while the relays and the rollouts start (`wait_loaded` below).
        rt.trainer = rt._start_trainer(wait=False)
        trainer_node = rt.trainer.call_rank0("node_id", timeout=cfg.run.timeout_s)
        master = factory.relay(trainer_node, "relay-master")
        rt.relays = [master]
        if resume is not None:
            recorder.log("phase", what=f"restoring the checkpoint {resume}")
            rt.trainer.wait_loaded(LOAD_TIMEOUT_FACTOR * cfg.run.timeout_s)
            rt.restore(resume)
            if rt.version != factory.version:
                raise RuntimeError(
                    f"{resume}: the trainer restored version {rt.version}, its trainer_state.json says "
                    f"{factory.version}"
                )
        recorder.log(  # where this segment of the run starts, for `laminar audit`
            "segment",
            resumed_at=rt.version if resume is not None else None,
            group_size=t.group_size,
            issued_groups=ray.get(rt.prompt_pool.stats.remote(), timeout=cfg.run.timeout_s)["issued"],
        )
        # The manager starts the replicas, a relay on each of their machines and the chain; it makes every
        # replacement later with the same factory.
        recorder.log(
            "phase",
            what=f"starting {r.replicas} rollout replicas and the relay chain (each replica loads the model and "
            "warms up its engine" + (", capturing CUDA graphs)" if cuda else ")"),
        )
        # placement, the relays and the chain each within run.timeout_s, the replicas' start within its own
        # (not sent again if the manager is lost meanwhile: a start cut short fails the run's start)
        rt.relays = ray.get(
            rt.manager.start.options(max_task_retries=0).remote(master, trainer_node, r.replicas),
            timeout=3 * cfg.run.timeout_s + r.start_timeout_s,
        )
        rt.replicas = ray.get(rt.manager.live_replicas.remote(), timeout=cfg.run.timeout_s)
        rt.check_control()  # each control actor's process, to tell a restart later
        # The trainer publishes into the master from its first step on. Attached only now: the call waits for the
        # trainer's imports (its policy loads meanwhile), and the replicas started in that time.
        rt.trainer.call("attach_master", master, timeout=cfg.run.timeout_s)
        recorder.log("phase", what="waiting for the trainer's policy")
        rt.trainer.wait_loaded(LOAD_TIMEOUT_FACTOR * cfg.run.timeout_s)
        if cfg.eval.every > 0:
            rt.evaluator = Evaluator(
                cfg.eval,
                eval_rows(cfg),
                codec.encode_prompt,
                rt.manager,
                rt.buffer,
                recorder,
                r.max_new_tokens,
                cfg.run.timeout_s,
            )
            if cfg.eval.at_start:
                rt.evaluator.submit(rt.version)
        recorder.log(
            "phase", what=f"generating: the first step waits for {t.groups_per_step} complete groups"
        )
        return rt

    def stop(self, settle: bool = False) -> dict[str, Any]:
        """Stop the rollouts and write the `end` record. `settle` (a run that ended normally): first every
        replica and relay is asked once more, so a failure not noticed yet (a machine lost in the last steps) is
        counted and the dead replicas' work is recovered onto live ones, in flight at the end rather than lost
        (`Supervisor.settle`); bounded by one `rollout.dead_after_s` and the recovery's own timeouts."""
        if settle:  # a control actor restarted since the last look is counted
            self.check_control()
        # A batch taken for a step that never finished (Ctrl-C) goes back to the buffer before anything is
        # recorded or checkpointed.
        returned = ray.get(self.buffer.return_lent.remote(), timeout=self.cfg.run.timeout_s)
        if returned:
            self.recorder.log("returned_to_buffer", groups=returned)
        wait, bound = self.cfg.run.timeout_s, "run.timeout_s"
        if settle:
            wait, bound = wait + 2 * self.cfg.rollout.dead_after_s, "run.timeout_s + 2 x rollout.dead_after_s"
            self.recorder.log(
                "phase",
                what="stopping: every replica and relay is asked once more (a failure not noticed yet is counted "
                f"and its work recovered; at most {wait:g} s)",
            )
        try:
            report = ray.get(self.manager.stop.remote(settle), timeout=wait)
        except ray.exceptions.GetTimeoutError:
            raise TimeoutError(
                f"stopping the rollouts: the rollout manager did not answer within {wait:g} s ({bound})"
            ) from None
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
                running.update(ray.get(actor.snapshot.remote(), timeout=self.cfg.run.timeout_s).inflight)
            except ray.exceptions.RayError:
                continue  # died at the very end: what it held is not in flight anywhere
        return running

    def _start_trainer(self, wait: bool = True) -> TrainerGroup:
        """The trainer's ranks (one unless `trainer.num_workers`); a single rank prefers the driver's machine,
        like the control plane, so the master relay and the checkpoint writes are local. `wait`: return once
        the policy is loaded (else the caller calls `wait_loaded` before using it)."""
        resources, plain = self.trainer_spec
        t = self.cfg.trainer
        group = TrainerGroup.start(
            plain,
            self.cfg.relay.slots,
            t.num_workers,
            resources,
            self.cfg.run.timeout_s,
            on_driver_node(soft=True),
            spread=t.placement == "spread",
        )
        if wait:
            group.wait_loaded(LOAD_TIMEOUT_FACTOR * self.cfg.run.timeout_s)
        return group

    def _restart_trainer(self) -> None:
        """The trainer died: a new one loads the last checkpoint and trains again on every batch consumed since
        (the driver kept them), so it stands where the dead one stood; the rollouts never stopped meanwhile."""
        t = self.cfg.run.timeout_s
        self.recorder.log("failure", what="trainer", version=self.version)
        self.trainer.kill()  # every rank: a survivor would wait in a collective for the dead one
        self.trainer = self._start_trainer()
        node = self.trainer.call_rank0("node_id", timeout=t)
        master = self.relays[0]
        try:
            same_node = ray.get(master.__ray_call__.remote(_node_of), timeout=t) == node
        except ray.exceptions.RayError:
            same_node = False  # the master died with the trainer's machine
        if not same_node:  # the publisher maps the master's slots: a new master beside the new trainer
            self.relays = ray.get(self.manager.move_master.remote(node), timeout=t * 2)
            master = self.relays[0]
        self.trainer.call("attach_master", master, timeout=t)
        if self.last_checkpoint is not None:
            self.trainer.call("load_checkpoint", str(self.last_checkpoint), timeout=t * 5)
        for batch in self.since_checkpoint:
            self.trainer.call("replay", batch, timeout=t * 5)
        caught_up = self.trainer.call("version", timeout=t)
        if caught_up != self.version:
            raise RuntimeError(
                f"the restarted trainer is at version {caught_up} after replay, expected {self.version}"
            )

    def checkpoint(self, path: Path) -> None:
        write_checkpoint(self, path)
        self.last_checkpoint, self.since_checkpoint = path, []

    def restore(self, path: Path) -> None:
        restore_checkpoint(self, path)

    def shutdown(self) -> None:
        """Free every actor and the relays' and the trainer's shared memory (a process may run several runtimes
        in a row)."""
        if self.trainer is not None:
            self.trainer.close()  # a dead rank's slots are swept at the next run's start on its node
        if self.manager is not None:
            try:  # the chain as it stands (the manager may have replaced relays since the driver last asked)
                self.relays = ray.get(self.manager.chain.remote(), timeout=10)
            except ray.exceptions.RayError:
                pass
        for relay in self.relays:
            try:
                ray.get(relay.shutdown.remote(), timeout=10)
            except ray.exceptions.RayError:
                pass  # already dead; its node's /dev/shm is swept by the next relay there
        if self.trainer is not None:
            self.trainer.kill()
        actors = [
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
        if self.namespace:  # every replica and relay of the run, however it was made
            sweep(self.namespace)
            shutil.rmtree(self.recorder.out_dir / JOURNAL, ignore_errors=True)
