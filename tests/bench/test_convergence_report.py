"""`laminar bench convergence`: time to accuracy, accuracy at equal wall time and at equal steps, the comparison over
seeds, and `--report` rebuilding all of it from run folders alone (synthetic `metrics.jsonl`, no training)."""

from __future__ import annotations

import json
import statistics

import pytest

from laminar.bench.convergence import main, parse_variant
from laminar.bench.convergence_report import accuracy_at, curve, time_to

FIRST_DISPATCH = 5.0  # run-relative time of the first dispatched prompt: wall times count from it


def run_folder(path, evals, p99=40.0):
    """A run folder with the records `curve` reads: `evals` as (version, wall_s, accuracy), wall time from the
    first dispatch; one trainer step per evaluated version after 0, published at the evaluation's time."""
    path.mkdir(parents=True)
    records = [{"kind": "phase", "t": 1.0, "what": "starting"}, {"kind": "dispatch", "t": FIRST_DISPATCH}]
    for version, wall_s, accuracy in evals:
        t = FIRST_DISPATCH + wall_s
        if version:
            lengths = {"response_len_mean": 12.0, "response_len_p50": 10.0, "response_len_p90": 30.0}
            records.append(
                {"kind": "step", "t": t, "step": version, "reward_mean": accuracy, **lengths}
                | {"response_len_p99": p99 + version, "response_len_max": 64}
            )
        records.append(
            {"kind": "eval", "t": t + 1, "version": version, "t_version": t, "accuracy": accuracy}
            | {"response_len_mean": 11.0}
        )
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# time to 0.5: laminar 10 s and 20 s, sync 30 s and 40 s (seeds 0 and 1); one_step (old layout) never
RUNS = {
    "runs/laminar/seed-0": [(0, 0.0, 0.1), (2, 10.0, 0.5), (4, 20.0, 0.6), (6, 40.0, 0.7)],
    "runs/laminar/seed-1": [(0, 0.0, 0.2), (2, 12.0, 0.3), (4, 20.0, 0.55), (6, 50.0, 0.65)],
    "runs/sync/seed-0": [(0, 0.0, 0.1), (2, 15.0, 0.2), (4, 30.0, 0.5), (6, 60.0, 0.6)],
    "runs/sync/seed-1": [(0, 0.0, 0.2), (3, 25.0, 0.3), (4, 40.0, 0.5), (6, 48.0, 0.5)],
    "runs/one_step": [(0, 0.0, 0.1), (2, 30.0, 0.2), (4, 45.0, 0.3), (6, 70.0, 0.4)],
}


@pytest.fixture
def bench(tmp_path):
    for folder, evals in RUNS.items():
        run_folder(tmp_path / folder, evals)
    return tmp_path


def test_a_curve_is_timed_from_the_first_dispatch(bench):
    c = curve(bench / "runs/laminar/seed-1")
    assert [(e["version"], e["wall_s"]) for e in c["evals"]] == [(0, 0.0), (2, 12.0), (4, 20.0), (6, 50.0)]
    assert time_to(c["evals"], 0.5) == 20.0 and time_to(c["evals"], 0.9) is None
    # the accuracy shown by then: the last evaluation at or before the time
    assert [accuracy_at(c["evals"], t) for t in (0.0, 11.9, 12.0, 49.0, 99.0)] == [0.2, 0.2, 0.3, 0.55, 0.65]
    assert [s["step"] for s in c["steps"]] == [2, 4, 6] and c["steps"][-1]["response_len_p99"] == 46.0
    assert accuracy_at([], 1.0) is None


def test_report_rebuilds_the_comparison_over_seeds(bench, capsys):
    assert main(["--report", str(bench), "--targets", "0.5,0.9"]) == 0
    for name in ("convergence.json", "convergence.md", "convergence.png"):
        assert (bench / name).stat().st_size > 0
    report = json.loads((bench / "convergence.json").read_text())
    assert list(report["results"]) == ["laminar", "sync", "one_step"]  # --schedules' order, then any others
    assert list(report["results"]["one_step"]) == ["0"]  # the older layout counts as seed 0

    lam = report["over_seeds"]["laminar"]["0.5"]
    assert lam["by_seed"] == {"0": 10.0, "1": 20.0} and lam["reached"] == 2
    assert (lam["mean"], lam["min"], lam["max"]) == (15.0, 10.0, 20.0)
    assert lam["sd"] == pytest.approx(statistics.stdev([10.0, 20.0]))
    assert report["over_seeds"]["one_step"]["0.5"]["reached"] == 0

    pairs = {(p["target"], p["schedule"], p["other"]): p for p in report["versus"]}
    sync = pairs[(0.5, "laminar", "sync")]  # sync's time over laminar's: 30/10 and 40/20
    assert sync["ratio_by_seed"] == {"0": 3.0, "1": 2.0}
    assert sync["ratio_of_means"] == pytest.approx(35 / 15) and sync["mean_of_ratios"] == pytest.approx(2.5)
    assert pairs[(0.5, "sync", "laminar")]["ratio_of_means"] == pytest.approx(15 / 35)
    assert pairs[(0.5, "laminar", "one_step")]["ratio_of_means"] is None  # never reached: nothing to compare

    top = {h["target"]: h for h in report["headline"]}
    assert top[0.5]["fastest_other"] == "sync" and top[0.5]["mean_of_ratios"] == pytest.approx(2.5)
    assert top[0.9]["fastest_other"] is None

    # equal wall time: the shortest last evaluation (laminar seed 0, 40 s) and 1/4, 1/2, 3/4 of it
    assert report["equal_wall_s"] == [10.0, 20.0, 30.0, 40.0]
    assert report["results"]["laminar"]["1"]["accuracy_at_wall_s"] == [0.2, 0.55, 0.55, 0.55]
    assert report["results"]["sync"]["1"]["accuracy_at_wall_s"] == [0.2, 0.2, 0.3, 0.5]
    # equal steps: the versions every run evaluated (sync seed 1 skipped 2)
    assert report["equal_versions"] == [0, 4, 6]
    assert report["results"]["sync"]["1"]["accuracy_at_versions"] == [0.2, 0.5, 0.5]

    md = (bench / "convergence.md").read_text()
    assert md == capsys.readouterr().out
    assert "sync's time over laminar's: 2.33x (ratio of means), 2.50x (mean of per-seed ratios" in md
    assert "| laminar | mean | 0.350 | 0.575 | 0.575 | 0.625 |" in md  # accuracy at equal wall time
    assert "| laminar | 0 | 10 / 42 / 64 (step 2) | 10 / 44 / 64 (step 4) | 10 / 46 / 64 (step 6) |" in md


def test_report_keeps_the_device_runs_meta_and_targets(bench):
    (bench / "convergence.json").write_text(
        json.dumps(
            {"meta": {"machine": "2 x H100", "command": "laminar bench convergence x.yaml", "targets": [0.3]}}
        )
    )
    with (bench / "runs/sync/seed-0/metrics.jsonl").open("a") as f:
        f.write('{"kind": "eval", "t": 9')  # a run cut mid-write
    assert main(["--report", str(bench)]) == 0
    report = json.loads((bench / "convergence.json").read_text())
    assert report["meta"]["machine"] == "2 x H100" and report["meta"]["targets"] == [0.3]
    assert report["over_seeds"]["one_step"]["0.3"]["by_seed"] == {"0": 45.0}


def test_bad_arguments_are_named(tmp_path, capsys):
    for args, says in (
        (["--report", str(tmp_path)], "holds no run folders"),
        (["--report", str(tmp_path), "job.yaml"], "takes no CONFIG"),
        ([], "give the job's CONFIG"),
        (["job.yaml", "--seeds", "0,x"], "--seeds '0,x'"),
        (["--report", str(tmp_path), "--targets", "half"], "--targets 'half'"),
        (["job.yaml", "--variant", "trainer.advantage"], "expected NAME=OVERRIDES"),
    ):
        with pytest.raises(SystemExit):
            main(args)
        assert says in capsys.readouterr().err


def test_a_variant_is_a_name_and_its_overrides():
    assert parse_variant("gspo=trainer.ratio=sequence  trainer.clip_low=3e-4") == (
        "gspo",
        ["trainer.ratio=sequence", "trainer.clip_low=3e-4"],
    )
    assert parse_variant("grpo=") == ("grpo", [])
    for bad in ("grpo", "=trainer.lr=1", "a.b=trainer.lr=1"):
        with pytest.raises(ValueError, match="NAME=OVERRIDES"):
            parse_variant(bad)
