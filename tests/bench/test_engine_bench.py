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
