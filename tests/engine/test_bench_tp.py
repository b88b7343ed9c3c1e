"""`laminar bench tp` on CPU: one gloo rank and two, a tiny shape, every (degree, batch) row with its roofline
from each rank's shard of the weights and KV heads."""

from __future__ import annotations

import json

import pytest

from laminar.bench.tensor_parallel import main
from laminar.engine.random_model import model_config
from laminar.engine.tensor_parallel import local_config

DEGREES, BATCHES, CONTEXT, STEPS = (1, 2), (1, 4), 16, 5
FLOAT32 = 4


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench-tp")
    argv = "--model tiny --tp 1,2 --device cpu --dtype float32 --batch-sizes 1 4 --warmup 2 --timeout 120".split()
    argv += ["--context", str(CONTEXT), "--steps", str(STEPS), "--out", str(out)]
    assert main(argv) == 0
    got = json.loads((out / "tp.json").read_text())
    got["md"] = (out / "tp.md").read_text()
    got["png"] = (out / "tp.png").stat().st_size
    return got


def shard_weight_bytes(world: int) -> int:
    """What one rank's decode step reads of the tiny shape's weights, from the shape: lm_head (tied to the
    embedding) and norms whole, each layer's projections and MLP split `world` ways, q/k/v biases with them."""
    cfg = local_config(model_config("tiny"), world)
    h, d, q, kv = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    layer = h * d * (2 * q + 2 * kv) + d * (q + 2 * kv) + 3 * h * cfg.intermediate_size + 2 * h
    return FLOAT32 * (cfg.vocab_size * h + h + cfg.num_layers * layer)


def test_every_degree_and_batch_is_timed(result):
    rows = result["rows"]
    assert sorted((r["tp"], r["batch"]) for r in rows) == [(n, b) for n in DEGREES for b in BATCHES]
    for r in rows:
        assert r["step_ms"] > 0 and r["roofline_ms"] > 0 and r["tokens_per_s"] > 0
        assert len(r["step_ms_all"]) == STEPS and min(r["step_ms_all"]) > 0
        assert r["step_over_roofline"] == pytest.approx(r["step_ms"] / r["roofline_ms"])
        assert r["mean_context"] == pytest.approx(CONTEXT, abs=0.5)
    assert all(not d.get("error") and not d["skipped"] for d in result["degrees"])


def test_roofline_reads_each_rank_s_shard(result):
    """Weights by the shard's shape (the ranks built only their shards); KV heads 2 on one rank, 1 on each of
    two; the roofline's bytes are weights, the batch's embedding rows and its keys and values."""
    cfg = model_config("tiny")
    degrees = {d["tp"]: d for d in result["degrees"]}
    for n, d in degrees.items():
        assert d["weight_bytes_per_rank"] == shard_weight_bytes(n)
        assert d["kv_heads_per_rank"] == cfg.num_kv_heads // n
        assert d["kv_bytes_per_token_per_rank"] == 2 * cfg.num_layers * (cfg.num_kv_heads // n) * 64 * FLOAT32
        assert d["bandwidth_bytes_per_s"] > 0 and d["cuda_graph_sizes"] == [] and d["pipelined"] is False
    for r in result["rows"]:
        d = degrees[r["tp"]]
        want = (
            d["weight_bytes_per_rank"]
            + r["batch"] * cfg.hidden_size * FLOAT32
            + r["batch"] * r["mean_context"] * d["kv_bytes_per_token_per_rank"]
        )
        assert r["roofline_bytes"] == pytest.approx(want)
        assert r["roofline_ms"] == pytest.approx(1e3 * want / d["bandwidth_bytes_per_s"])


def test_all_reduces_are_timed_with_several_ranks(result):
    """Two all-reduces a layer (o_proj, down_proj) at TP=2; none at TP=1."""
    layers = model_config("tiny").num_layers
    for r in result["rows"]:
        if r["tp"] == 1:
            assert "allreduce_ms" not in r
        else:
            assert r["allreduce_calls_per_step"] == 2 * layers
            assert r["allreduce_ms"] > 0 and r["allreduce_share"] > 0


def test_meta_table_and_plot(result):
    meta = result["meta"]
    assert meta["command"].startswith("laminar bench tp --model tiny")
    assert meta["torch"] and meta["code"] and meta["device"] == "cpu" and meta["device_count"] == 0
    assert result["shape"]["num_layers"] == 4 and result["context"] == CONTEXT
    table = [line for line in result["md"].splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [tuple(int(x) for x in line.split("|")[1:3]) for line in table] == [
        (n, b) for n in DEGREES for b in BATCHES
    ]
    assert result["png"] > 0
