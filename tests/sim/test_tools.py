"""The simulator's tool workload: a request parks on its tool call with its KV kept, waits for a free tool
worker, resumes prefilling only the call's output, and moves or recovers while parked without losing a call."""

from __future__ import annotations

import dataclasses
import heapq
import itertools

import pytest

from laminar.sim.config import SCHEDULES, SIM_REPACK, Failure, SimConfig
from laminar.sim.lengths import LengthConfig
from laminar.sim.replica import Group, Replica, Traj
from laminar.sim.run import simulate

STEP_S, PREFILL_S = 0.01, 0.001  # a decode step at any batch, a prefilled token


class Clock:
    def __init__(self) -> None:
        self.events: list = []
        self.seq = itertools.count()
        self.now = 0.0
        self.finished: dict[int, float] = {}

    def at(self, t, fn, arg=None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), fn, arg))

    def run(self) -> None:
        while self.events:
            t, _, fn, arg = heapq.heappop(self.events)
            self.now = t
            fn(arg, t)

    def replica(self, rid: int = 0, tool_workers: int = 4) -> Replica:
        return Replica(
            rid,
            0,
            decode_base=[STEP_S] * 65,
            per_token_s=0.0,
            prefill_s=lambda tokens: PREFILL_S * tokens,
            kv_capacity=10_000,
            max_seqs=64,
            schedule_event=self.at,
            on_finish=lambda traj, r: self.finished.__setitem__(traj.tid, self.now),
            on_drained=lambda r: None,
            tool_workers=tool_workers,
        )


def traj(tid: int, latency: float = 1.0) -> Traj:
    """Prompt 4, a call after 10 sampled tokens returning 5, then 15 more sampled: 30 response tokens."""
    t = Traj(tid, Group(tid, 0), 4, 30, 0, calls=(10,), latencies=(latency,), out_tokens=5)
    t.group.trajs.append(t)
    return t


def test_a_call_parks_the_request_with_its_kv_and_resumes_with_only_its_output_prefilled():
    clock = Clock()
    r = clock.replica()
    t = traj(0)
    r.add([t], 0.0)
    clock.at(0.5, lambda _, now: seen.update(kv=r.kv_used, running=len(r.running), parked=len(r.parked)))
    seen: dict = {}
    clock.run()
    # prefill 4, 10 steps, the call (1 s), prefill of its 5 tokens, 15 steps
    assert clock.finished[0] == pytest.approx(4 * PREFILL_S + 10 * STEP_S + 1.0 + 5 * PREFILL_S + 15 * STEP_S)
    assert seen == {"kv": 14, "running": 0, "parked": 1}  # out of the batch, its prompt and 10 tokens kept
    assert t.generated == t.target == 30 and t.reprefill == 0 and r.idle
    assert r.busy.tool_wait == pytest.approx(1.0)


def test_calls_queue_for_the_replicas_tool_workers():
    ends = {}
    for workers in (1, 2):
        clock = Clock()
        r = clock.replica(tool_workers=workers)
        r.add([traj(0), traj(1)], 0.0)
        clock.run()
        ends[workers] = clock.finished[1] - clock.finished[0]
    assert ends[2] == pytest.approx(0.0, abs=1e-9)  # both calls at once
    assert ends[1] == pytest.approx(1.0)  # the second waits for the one worker


def test_a_request_moved_while_parked_resumes_when_its_call_returns_with_its_context_prefilled():
    clock = Clock()
    source, dest = clock.replica(0), clock.replica(1)
    t = traj(0)
    source.add([t], 0.0)
    moved = {}

    def move(_, now):
        assert t in source.parked
        source.take(t)
        dest.add([t], now)
        moved.update(kv_source=source.kv_used, idle=source.idle)

    clock.at(0.5, move)
    clock.run()
    assert moved == {"kv_source": 0, "idle": True}
    # back at 0.104 + 1.0 on the destination, which prefills the 14 tokens it never held and the 5 returned
    assert clock.finished[0] == pytest.approx(
        4 * PREFILL_S + 10 * STEP_S + 1.0 + 19 * PREFILL_S + 15 * STEP_S
    )
    assert t.reprefill == 14 and t.generated == 30


TOOLS = LengthConfig(
    kind="lognormal", median=64, max_response=512, prompt_median=32, tool_calls_mean=2.0, tool_output_tokens=8
)
SMALL = SimConfig(
    gpus=8, model="0.5B", groups_per_step=16, group_size=4, steps=8, warmup_steps=2, trainer_frac=0.25,
    lengths=TOOLS, repack=dataclasses.replace(SIM_REPACK, interval_s=0.25),
)  # fmt: skip


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_trains_each_tool_using_trajectory_once(schedule):
    summary, cluster = simulate(SMALL.with_(schedule=schedule), audit=True)
    assert cluster.versions_seen == list(range(1, SMALL.steps + 1))
    assert all(n == 1 for n in cluster.finish_count.values())
    assert all(n == 1 for n in cluster.consume_count.values())
    assert len(cluster.consume_count) == SMALL.steps * SMALL.groups_per_step * SMALL.group_size
    assert sum(r.busy.tool_wait for r in cluster.replicas) > 0  # replicas did wait on calls


def test_tool_calls_slow_the_run_and_more_workers_give_it_back():
    single = simulate(SMALL.with_(lengths=dataclasses.replace(TOOLS, tool_calls_mean=0.0)))[0]
    few = simulate(SMALL.with_(tool_workers=1))[0]
    many = simulate(SMALL.with_(tool_workers=64))[0]
    assert few["training_throughput"] < many["training_throughput"] < single["training_throughput"]


def test_laminar_recovers_parked_trajectories_of_a_lost_machine():
    cfg = SMALL.with_(
        schedule="laminar", gpus=24, trainer_frac=0.34, failures=(Failure(time_s=5.0, machine=0),)
    )
    summary, cluster = simulate(cfg, audit=True)
    assert summary["failures"]["recovered_trajectories"] + summary["failures"]["restarted_trajectories"] > 0
    assert all(n == 1 for n in cluster.consume_count.values())
    assert len(cluster.consume_count) == cfg.steps * cfg.groups_per_step * cfg.group_size


def test_the_bench_replay_draws_the_runtimes_own_rows_call_for_call(tiny_model_dir):
    """`lengths.kind: bench` with tools stands for `task.name=lengths` with tools: the same rows, the same
    tool scripts (calls capped at `task.max_turns`), so a simulated group is the measured run's group."""
    from laminar.configure import load_config
    from laminar.tasks.rows import train_rows

    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "task.name=lengths",
            "task.length_median=64",
            "task.tool_calls_mean=2",
            "task.tool_output_tokens=8",
            "task.num_prompts=256",
            "task.seed=3",
            "task.max_turns=3",
            "rollout.max_new_tokens=512",
        ],
    )
    t = cfg.task
    lengths = LengthConfig.from_task(cfg)
    runtime = train_rows(cfg)
    simulated = lengths.workload().rows(t.num_prompts)
    assert [r["tool_script"] for r in runtime if "tool_script" in r] == [
        r["tool_script"] for r in simulated if "tool_script" in r
    ]
    assert [r["sampling"] for r in runtime] == [r["sampling"] for r in simulated]
    assert max(len(r["tool_script"]["calls_at"]) for r in runtime if "tool_script" in r) == 3


def test_the_bench_replay_of_a_run_with_a_lengths_file_draws_from_that_file(tiny_model_dir, tmp_path):
    """A run whose response lengths come from `task.lengths_file` is replayed with the same lengths, not with
    the lognormal law the file replaces."""
    from laminar.configure import load_config
    from laminar.tasks.rows import train_rows

    lengths_file = tmp_path / "lengths.txt"
    lengths_file.write_text("\n".join(str(n) for n in (3, 17, 250, 900)) + "\n")
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            "task.name=lengths",
            f"task.lengths_file={lengths_file}",
            "task.num_prompts=64",
            "rollout.max_new_tokens=512",
        ],
    )
    runtime = train_rows(cfg)
    simulated = LengthConfig.from_task(cfg).workload().rows(cfg.task.num_prompts)
    assert [r["sampling"] for r in runtime] == [r["sampling"] for r in simulated]
    drawn = {r["sampling"]["max_new_tokens"] for r in runtime}
    assert drawn <= {3, 17, 250, 512} and len(drawn) > 1  # the file's lengths, capped at max_new_tokens


def test_the_bench_replay_carries_every_field_of_the_runtime_workload():
    """`LengthConfig.of_workload` and `workload` are inverses (prompt words aside, which no length depends
    on): a field the simulator's config dropped would replay other rows than the run's."""
    import dataclasses

    from laminar.tasks.lengths import LengthWorkload

    w = LengthWorkload(
        median=97,
        p99_ratio=7.5,
        max_len=777,
        prompt_len=5,
        lengths_file="lengths.txt",
        seed=11,
        tool_calls_mean=1.5,
        tool_calls_min=1,
        tool_latency_median_s=0.25,
        tool_latency_p99_ratio=4.0,
        tool_output_tokens=9,
        max_calls=3,
    )
    assert all(getattr(w, f.name) != f.default for f in dataclasses.fields(w)), "every field off its default"
    back = LengthConfig.of_workload(w, num_prompts=64).workload()
    assert dataclasses.replace(back, prompt_len=w.prompt_len) == w
