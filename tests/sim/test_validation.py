"""The small GPU schedule benchmark's configuration runs to completion with the schedules' ordering
invariants (timings are checked by `laminar simulate --validate`, not here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar.bench.schedules import VARIANTS as BENCH_VARIANTS
from laminar.configure import load_config
from laminar.schedules import Schedule
from laminar.sim.cluster import Cluster
from laminar.sim.measured import SMALL_GPU
from laminar.sim.run import simulate
from laminar.sim.schedules import schedule_of
from laminar.sim.validation import VARIANTS, small_gpu_config

GPU_CONFIG = Path(__file__).parents[2] / "configs" / "gpu-schedules.yaml"

MAX_STALENESS = {
    "sync": 0,
    "one_step": 1,
    "stream": 2,
    "partial": 2,
    "laminar": 5,
    "laminar_no_repack": 5,
    "laminar_global_push": 5,
}


@pytest.mark.parametrize("schedule", list(MAX_STALENESS))
def test_small_gpu_setup_completes_with_invariants(schedule: str) -> None:
    cfg = small_gpu_config(schedule=schedule)
    assert (cfg.trainer_gpus, cfg.rollout_replicas) == (1, 3)
    summary, cluster = simulate(cfg, audit=True)
    assert cluster.versions_seen == list(range(1, cfg.steps + 1))
    assert all(n == 1 for n in cluster.finish_count.values())
    assert all(n == 1 for n in cluster.consume_count.values())
    assert set(cluster.consume_count) <= set(cluster.finish_count)
    assert len(cluster.consume_count) == cfg.steps * cfg.groups_per_step * cfg.group_size
    assert summary["staleness"]["max"] <= MAX_STALENESS[schedule]
    step_end = cluster.record.step_end
    assert step_end == sorted(step_end)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("schedule", ["sync", "one_step", "stream", "partial"])
def test_in_order_schedules_train_the_measured_runs_groups(schedule: str, seed: int) -> None:
    """The baselines take batch v in dispatch order, so every simulated step trains exactly the tokens the
    measured run's step did: the workload replay (dataset seed, pool order by run seed) is exact."""
    _, cluster = simulate(small_gpu_config(schedule=schedule, seed=seed))
    assert cluster.record.step_tokens == list(SMALL_GPU.runs[seed][schedule].step_tokens)


@pytest.mark.parametrize("schedule", list(VARIANTS))
def test_simulated_schedule_is_the_measured_runs_schedule(schedule: str) -> None:
    """The simulator runs the very schedule value `laminar train` built for the measured variant (the
    benchmark's config and overrides, and the dispatch bound of the runtime when the runs were made; the model
    path is left out, it is only on the GPU machine)."""
    _, name, extra = next(v for v in BENCH_VARIANTS if v[0] == VARIANTS[schedule])
    then = [
        "model.path=",
        f"schedule.name={name}",
        "schedule.max_lag=null",
        "schedule.max_staleness=null",
        *extra,
    ]
    measured = Schedule.from_config(load_config(GPU_CONFIG, then))
    assert schedule_of(Cluster(small_gpu_config(schedule=schedule))) == measured


def test_the_trainer_benchmark_nearest_in_size_sets_the_trainers_mfu(tmp_path):
    """`laminar bench trainer` rows calibrate `train_mfu`: the nearest model in parameters, a sharded trainer
    preferred; CPU rows (no MFU) are ignored."""
    import json

    from laminar.sim.calibrate import from_trainer_bench
    from laminar.sim.cost import MODELS, CostModel

    rows = {
        "small": dict(params=4.9e8, ranks=1, mfu=0.14, shape="0.5b", machine="H100", tokens_per_s=1.0),
        "big1": dict(params=7.6e9, ranks=1, mfu=0.50, shape="7b", machine="H100", tokens_per_s=1.0),
        "big2": dict(params=7.6e9, ranks=2, mfu=0.33, shape="7b", machine="H100", tokens_per_s=1.0),
        "cpu": dict(params=7.6e9, ranks=2, mfu=None, shape="7b", machine="x86", tokens_per_s=1.0),
    }
    paths = []
    for name, row in rows.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(row))
        paths.append(tmp_path / f"{name}.json")
    cost, note = from_trainer_bench(paths, CostModel(), MODELS["7B"].params)
    assert cost.train_mfu == 0.33 and "big2" in note
    assert from_trainer_bench(paths, CostModel(), 5e8)[0].train_mfu == 0.14
    assert from_trainer_bench(paths[3:], CostModel(), 5e8)[0].train_mfu == CostModel().train_mfu


def test_the_committed_calibration_is_the_fit_of_the_committed_benchmark_files(tmp_path, monkeypatch):
    """`laminar simulate` takes its calibration from constants, the same from any folder; they are what the
    engine and trainer benchmark files in results/ fit to."""
    import glob

    from laminar.sim.cli import measured_cost
    from laminar.sim.cost import MODELS, CostModel

    root = Path(__file__).parents[2]
    engine = [str(root / "results" / "engine" / "engine-cuda.json")]
    trainer = sorted(glob.glob(str(root / "results" / "trainer" / "*" / "trainer.json")))
    monkeypatch.chdir(tmp_path)
    for model in MODELS.values():
        assert measured_cost(CostModel(), model.params) == measured_cost(
            CostModel(), model.params, engine, trainer
        )


def test_the_committed_tensor_parallel_latency_is_the_fit_of_the_tp_bench_files():
    """The time an all-reduce adds to a decode step, fitted on results/tp-decode; a 32B-shape replica at TP=2 then
    costs what the benchmark measured at batch 64 to within 15% (14.4 ms against 13.9), though no 32B row was in
    the fit."""
    import json

    from laminar.sim.calibrate import fit_tp_latency
    from laminar.sim.cost import MODELS, CostModel
    from laminar.sim.measured import TP_BENCH, TP_LAYER_LATENCY_S

    root = Path(__file__).parents[2]
    fitted, note = fit_tp_latency([root / p for p in TP_BENCH])
    assert fitted == pytest.approx(TP_LAYER_LATENCY_S) and "8 decode steps" in note
    rows = json.loads((root / "results" / "tp-decode" / "tp-7b.json").read_text())["rows"]
    tp1 = next(r for r in rows if r["tp"] == 1 and r["batch"] == 64)
    bench = json.loads((root / "results" / "tp-decode" / "tp-32b-graphs.json").read_text())
    row = next(r for r in bench["rows"] if r["batch"] == 64)
    # the cost model's decode efficiency as TP=1 measured it (the roofline over the step, overhead folded in)
    cost = CostModel(
        gpu_hbm_bw=bench["degrees"][0]["bandwidth_bytes_per_s"],
        decode_mem_eff=tp1["roofline_ms"] / tp1["step_ms"],
        step_overhead_s=0.0,
        tp_layer_latency_s=fitted,
    )
    model = MODELS["32B"]  # rollout_tp=2
    predicted = cost.decode_step_s(model, 64, 64 * row["mean_context"])
    assert predicted == pytest.approx(row["step_ms"] / 1e3, rel=0.15)
