"""`laminar bench engine` on CPU: the JSON it writes, and a decode step looked inside (`--profile`)."""

import json

from laminar.bench.engine import main


def test_bench_engine_writes_rows_and_looks_inside_a_step(tmp_path):
    argv = ["--device", "cpu", "--model", "tiny", "--batch-sizes", "4", "8", "--hf-batch-sizes", "4"]
    argv += ["--new-tokens", "12", "--profile", "8", "--out", str(tmp_path)]
    assert main(argv) == 0
    run = json.loads((tmp_path / "engine-cpu.json").read_text())["runs"][0]
    rows = {r["batch"]: r for r in run["engine"]}
    assert set(rows) == {4, 8} and "inside_step" not in rows[4]
    inside = rows[8]["inside_step"]
    assert inside["graph_batch"] == 0 and inside["profiled_step_ms"] > 0  # CPU: no graphs, no CUDA kernels
    assert all(r["decode_step_ms"] > 0 and r["step_over_roofline"] > 0 for r in rows.values())
    assert run["hf_generate"][0]["batch"] == 4


def test_bench_speculation_tail_workload(tmp_path, tiny_model_dir):
    """`--speculation off,on --workload tail`: each group's last sample arrives moved, with its siblings' text;
    every mode samples the same tokens in every interleaved run, and a row holds each run's tokens/s."""
    argv = ["--device", "cpu", "--model", str(tiny_model_dir), "--speculation", "off,on", "--task", "reverse"]
    argv += ["--batch-sizes", "2", "--new-tokens", "8", "--group-size", "3", "--workload", "tail"]
    argv += ["--repeats", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "engine-speculation-tail-cpu.json").read_text())
    assert result["workload"] == "tail" and result["repeats"] == 2
    rows = {r["mode"]: r for r in result["rows"]}
    assert set(rows) == {"off", "on"}
    for row in rows.values():
        assert row["batch"] == 2 and row["groups"] == 3  # at least a group's size of tail requests
        assert row["same_tokens_as_first"] == "6/6" and len(row["tokens_per_s_runs"]) == 2
        assert row["tokens"] > 0
    assert rows["off"]["draft_tokens"] == 0 and rows["on"]["draft_tokens"] > 0
    assert (tmp_path / "engine-speculation-tail-cpu.png").stat().st_size > 0  # on against off by batch
