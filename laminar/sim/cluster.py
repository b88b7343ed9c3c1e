"""The simulated cluster: the event clock and the parts every schedule shares.

Parts, as in the runtime: rollout replicas, the prompt pool (a group counter plus the length sampler), the
experience buffer (complete groups in the order they completed), the trainer, and the weight paths (a global GPU
broadcast for the baselines, publish + relay chain + pull for Laminar). A schedule's loop (`laminar.sim.schedules`)
decides who gets prompts and when weights move; the cluster does the bookkeeping and the accounting.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from laminar.data.experience_buffer import load_sampler
from laminar.data.staleness import staleness
from laminar.sim.config import SimConfig
from laminar.sim.lengths import LengthSampler
from laminar.sim.replica import Busy, Group, Replica, Traj


class Loop(Protocol):
    """What runs a schedule on the cluster: hooks the cluster calls (`laminar.sim.schedules`)."""

    in_order: bool  # the trainer takes batch v = groups v*g .. (v+1)*g - 1 (else the first groups completed)

    def start(self) -> None: ...
    def on_traj_done(self, traj: Traj, replica: Replica) -> None: ...
    def on_group_done(self, group: Group) -> None: ...
    def on_drained(self, replica: Replica) -> None: ...
    def on_trained(self, version: int) -> None: ...
    def on_failure(self, machine: int) -> None: ...


@dataclass
class TrainerTime:
    train: float = 0.0
    weights: float = 0.0  # publish stall (Laminar) or its share of a global broadcast (baselines)
    restart: float = 0.0


@dataclass
class Record:
    """What a run measured; `laminar.sim.metrics.summarise` turns it into the report."""

    step_end: list[float] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    step_response_tokens: list[int] = field(default_factory=list)
    staleness: Counter = field(default_factory=Counter)  # trajectories by (trainer version - their version)
    max_versions_per_traj: int = 1
    reprefill_tokens: float = 0.0
    finished: int = 0
    consumed: int = 0
    repacks: int = 0
    moved: int = 0
    released: int = 0
    split_groups: int = 0  # summed over repacks: the groups each left on more than one replica
    repack_plan_s: float = 0.0
    recovered: int = 0
    restarted: int = 0
    weight_updates: int = 0
    window_start: dict[str, Any] = field(default_factory=dict)


class Cluster:
    """Holds the state; `run()` drives the event loop until the trainer has made `cfg.steps` steps."""

    def __init__(self, cfg: SimConfig, *, audit: bool = False) -> None:
        self.cfg, self.cost, self.spec = cfg, cfg.cost, cfg.spec
        self.sampler = load_sampler(cfg.sampler)
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[Any, float], None], Any]] = []
        self._seq = itertools.count()
        self.lengths = LengthSampler(cfg.lengths, cfg.group_size, cfg.groups_per_step, cfg.seed)
        cost, spec = self.cost, self.spec
        decode_base = [cost.decode_base_s(spec, n) for n in range(cost.max_num_seqs + 1)]
        per_token = cost.decode_per_context_token_s(spec)
        kv_capacity = cost.kv_capacity_tokens(spec)
        per_machine = max(1, cost.gpus_per_machine // spec.rollout_tp)
        self.replicas = [
            Replica(
                rid,
                rid // per_machine,
                decode_base=decode_base,
                per_token_s=per_token,
                prefill_s=lambda tokens: cost.prefill_s(spec, tokens),
                kv_capacity=kv_capacity,
                max_seqs=cost.max_num_seqs,
                schedule_event=self.at,
                on_finish=self._on_finish,
                on_drained=self._on_drained,
                tool_workers=cfg.tool_workers,
            )
            for rid in range(cfg.rollout_replicas)
        ]
        self.machines = self.replicas[-1].machine + 1
        self.trainer_gpus = cfg.gpus if cfg.schedule.name == "verl" else cfg.trainer_gpus
        self.rollout_gpus = len(self.replicas) * spec.rollout_tp
        self.loop: Loop | None = None
        # prompt pool and experience buffer
        self.next_gid = 0
        self._next_tid = 0
        self.complete: dict[int, Group] = {}  # complete groups not trained on, by id, in completion order
        # groups dispatched and not yet complete, by the version they generate with (few versions: `min` is cheap)
        self.generating: Counter = Counter()
        self.n_unconsumed = 0  # groups dispatched and not yet trained on
        self.consumed_groups = 0  # groups trained on, as the manager counts them (at the end of a step)
        # trainer
        self.version = 0
        self.training = False
        self.train_end = 0.0
        self.trainer_free_at = 0.0
        self.trainer_time = TrainerTime()
        self.record = Record()
        self.audit = audit
        self.finish_count: Counter = Counter()
        self.consume_count: Counter = Counter()
        self.versions_seen: list[int] = []

    # ---- clock -------------------------------------------------------------------------------------------

    def at(self, t: float, fn: Callable[[Any, float], None], arg: Any = None) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn, arg))

    def run(self, loop: Loop) -> Record:
        self.loop = loop
        for failure in self.cfg.failures:
            self.at(failure.time_s, lambda m, now: loop.on_failure(m), failure.machine)
        loop.start()
        events, steps, limit = self._events, self.cfg.steps, self.cfg.max_sim_time_s
        same = 0
        while events and self.version < steps:
            t, _, fn, arg = heapq.heappop(events)
            if t > limit:
                raise RuntimeError(f"simulated time passed max_sim_time_s={limit} at version {self.version}")
            same = same + 1 if t == self.now else 0
            if same > 1_000_000:
                raise RuntimeError(
                    f"{self.cfg.schedule.name}: a million events at t={t:.3f} s without time passing"
                )
            self.now = t
            fn(arg, t)
        if self.version < steps:
            raise RuntimeError(
                f"{self.cfg.schedule.name}: no events left at version {self.version} (deadlock)"
            )
        for r in self.replicas:
            r.advance(self.now)
        return self.record

    # ---- prompt pool -------------------------------------------------------------------------------------

    def new_group(self, version: int) -> Group:
        prompt, lengths = self.lengths.group(self.next_gid)
        script = self.lengths.script(self.next_gid, max(lengths))
        group = Group(self.next_gid, version, pending=len(lengths))
        self.next_gid += 1
        max_len = self.replicas[0].kv_capacity - 1  # max_model_len: one request must fit a replica
        for length in lengths:
            traj = Traj(
                self._next_tid, group, prompt, min(length, max_len - prompt), version, t_start=self.now
            )
            if script is not None:
                self._place_calls(traj, length, script)
            group.trajs.append(traj)
            self._next_tid += 1
        self.n_unconsumed += 1
        self.generating[group.version] += 1
        return group

    def oldest_generating(self) -> int | None:
        """The oldest version a group not yet complete holds (the manager's `Fleet.oldest_owed`)."""
        return min(self.generating, default=None)

    def regenerate(self, group: Group, version: int) -> None:
        """A group not yet complete starts over at `version` (recovery's restart)."""
        if group.gid not in self.complete:
            self._done_generating(group)
            self.generating[version] += 1
        group.version = version

    def _done_generating(self, group: Group) -> None:
        self.generating[group.version] -= 1
        if not self.generating[group.version]:
            del self.generating[group.version]

    def _place_calls(self, traj: Traj, length: int, script: dict[str, Any]) -> None:
        """The group's tool calls on one sample, as the runtime's replica plays a row's `tool_script`: call i
        comes after `calls_at[i]` sampled tokens, so after `calls_at[i] + i * out` response tokens, and each
        appends `out` tokens. A bench row's length already counts the outputs; a drawn length is the sampled
        tokens alone. Calls past the sample's sampled tokens (or the context limit) are not made."""
        out = int(script["output_tokens"])
        calls_at, latency = script["calls_at"], script["latency_s"]
        sampled = length - len(calls_at) * out if self.cfg.lengths.kind == "bench" else length
        limit = self.replicas[0].kv_capacity - 1 - traj.prompt
        made: list[int] = []
        for i, at in enumerate(calls_at):
            if at >= sampled or at + (len(made) + 1) * out >= limit:
                break
            made.append(i)
        traj.calls = tuple(calls_at[i] + j * out for j, i in enumerate(made))
        traj.latencies = tuple(latency[i] for i in made)
        traj.target = min(sampled + len(made) * out, limit)
        traj.out_tokens = out

    def dispatch(self, replica: Replica, groups: int) -> None:
        """Give `replica` that many new prompt groups, generated with its current version."""
        if groups <= 0:
            return
        trajs = [t for _ in range(groups) for t in self.new_group(replica.version).trajs]
        replica.add(trajs, self.now)

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive]

    # ---- replica callbacks -------------------------------------------------------------------------------

    def _on_finish(self, traj: Traj, replica: Replica) -> None:
        self.record.finished += 1
        self.record.reprefill_tokens += traj.reprefill
        if traj.versions > self.record.max_versions_per_traj:
            self.record.max_versions_per_traj = traj.versions
        if self.audit:
            self.finish_count[traj.tid] += 1
        group = traj.group
        group.pending -= 1
        assert self.loop is not None
        self.loop.on_traj_done(traj, replica)
        if group.pending == 0:
            group.t_done = self.now
            self._done_generating(group)
            self.complete[group.gid] = group
            self.loop.on_group_done(group)

    def _on_drained(self, replica: Replica) -> None:
        assert self.loop is not None
        self.loop.on_drained(replica)

    # ---- trainer -----------------------------------------------------------------------------------------

    def buffered(self) -> list[Group]:
        """Complete groups not yet trained on."""
        return list(self.complete.values())

    def _take_batch(self) -> list[Group] | None:
        """A global batch if the buffer holds one: batch v in dispatch order (the baselines' `rt.take` with
        group ids), or what the experience buffer's sampler picks (Laminar: first completed first by default)."""
        g = self.cfg.groups_per_step
        assert self.loop is not None
        if self.loop.in_order:
            ids = range(self.version * g, (self.version + 1) * g)
        else:  # the runtime's own sampler (`buffer.sampler`): a sim group stands where a group's samples would
            ready = list(self.complete.values())
            ids = [ready[i].gid for i in self.sampler([[grp] for grp in ready], g, self.version)]
        if len(ids) < g or any(i not in self.complete for i in ids):
            return None
        return [self.complete.pop(i) for i in ids]

    def try_train(self, *_: Any) -> bool:
        """Start a trainer step if it is free and the buffer holds its batch."""
        if self.training or self.now < self.trainer_free_at:
            return False
        batch = self._take_batch()
        if batch is None:
            return False
        self.training = True
        tokens = response = 0
        for group in batch:
            self.n_unconsumed -= 1
            self.record.staleness[staleness(self.version, group.version)] += len(group.trajs)
            self.record.consumed += len(group.trajs)
            for t in group.trajs:
                tokens += t.prompt + t.target
                response += t.target
                if self.audit:
                    self.consume_count[t.tid] += 1
        seconds = self.cost.train_s(self.spec, tokens, self.trainer_gpus)
        self.trainer_time.train += seconds
        self.train_end = self.now + seconds
        self.at(self.now + seconds, self._trained, (tokens, response, len(batch)))
        return True

    def _trained(self, arg: tuple[int, int, int], now: float) -> None:
        self.training = False
        self.consumed_groups += arg[2]
        self.trainer_free_at = max(self.trainer_free_at, now)
        self.version += 1
        self.versions_seen.append(self.version)
        self.record.step_end.append(now)
        self.record.step_tokens.append(arg[0])
        self.record.step_response_tokens.append(arg[1])
        if self.version == self.cfg.warmup_steps:
            self._snapshot()
        assert self.loop is not None
        self.loop.on_trained(self.version)

    def trainer_stall(self, seconds: float, kind: str = "weights") -> None:
        """The trainer cannot train for `seconds` from now (or from the end of its current step)."""
        if seconds <= 0:
            return
        base = max(self.trainer_free_at, self.now, self.train_end if self.training else 0.0)
        self.trainer_free_at = base + seconds
        setattr(self.trainer_time, kind, getattr(self.trainer_time, kind) + seconds)
        self.at(self.trainer_free_at, self.try_train)

    # ---- weights -----------------------------------------------------------------------------------------

    def pause(self, replicas: list[Replica], seconds: float, kind: str) -> None:
        for r in replicas:
            r.advance(self.now)
            r.stall(self.now, seconds, kind)
            r.reschedule(self.now)

    def global_restart(self) -> None:
        """A baseline loses a machine: the whole job restarts from its checkpoint and in-flight work is lost."""
        self.trainer_stall(self.cost.job_restart_s, "restart")
        for r in self.live():
            trajs = r.take_all(self.now)
            for t in trajs:
                self.record.restarted += t.generated > 0
                t.rewind()
            r.stall(self.now, self.cost.job_restart_s, "weights")
            r.add(trajs, self.now)

    def pull(self, replica: Replica, version: int) -> None:
        """A rollout copies a version from its machine's relay to its GPUs (between batches only)."""
        replica.advance(self.now)
        replica.stall(self.now, self.cost.pull_s(self.spec, self.cfg.relay_pinned), "weights")
        replica.version = version
        self.record.weight_updates += 1

    # ---- measures ----------------------------------------------------------------------------------------

    def _snapshot(self) -> None:
        """Accumulators at the end of warm-up, so the report covers only the measured window."""
        for r in self.replicas:
            r.advance(self.now)
        self.record.window_start = {
            "time": self.now,
            "busy": [Busy(**{k: getattr(r.busy, k) for k in Busy.__slots__}) for r in self.replicas],
            "trainer": TrainerTime(**vars(self.trainer_time)),
            "reprefill": self.record.reprefill_tokens,
            "repacks": (
                self.record.repacks,
                self.record.moved,
                self.record.released,
                self.record.split_groups,
            ),
        }
