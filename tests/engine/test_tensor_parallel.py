"""Tensor parallelism: a 2-rank engine (gloo, 2 CPU processes) samples what one process samples, moves requests
with their keys and values shard by shard, and each rank keeps the right slices of the weights."""

from __future__ import annotations

import dataclasses
import pickle
import socket
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from laminar.engine import Engine
from laminar.engine.tensor_parallel import (
    TPGroup,
    check_degree,
    gather_kv,
    kv_heads,
    shard_spec,
    shard_state_dict,
    split_kv,
)
from laminar.engine.weights import staged_copy
from tests.engine.tp_ranks import CONFIGS, PROMPTS, add_all, drain, engine, generate, rank_main, weights

WORLD = 2
TIMEOUT_S = 300  # about 10 s on an idle 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Every rank's results of every workload in `tp_ranks` (one spawn for the whole file)."""
    out = tmp_path_factory.mktemp("tp")
    ctx = mp.start_processes(
        rank_main, args=(WORLD, free_port(), str(out)), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {WORLD} tensor-parallel ranks did not finish within {TIMEOUT_S} s")
    return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(WORLD)]


@pytest.fixture(scope="module")
def single() -> dict:
    """The same workloads on one process."""
    return {name: generate(cfg, None) for name, cfg in CONFIGS.items()}


def assert_same_samples(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want) == sorted(PROMPTS)
    for rid, (tokens, logprobs) in want.items():
        assert got[rid][0] == tokens, rid
        assert got[rid][1] == pytest.approx(logprobs, abs=1e-5), rid


@pytest.mark.parametrize("name", [*CONFIGS, "llama-pipelined"])
def test_two_ranks_sample_what_one_process_samples(ranks, single, name):
    """Seeded and greedy requests of different lengths, two sharing a prompt: token for token (every step's
    agreement between the ranks is checked inside the run), log-probs to 1e-5."""
    want = single[name.removesuffix("-pipelined")]
    assert any(len(set(t)) > 3 for t, _ in want.values())  # not a degenerate model
    for r in range(WORLD):
        assert_same_samples(ranks[r][name], want)


def test_ranks_that_disagree_stop_together(ranks):
    """`TPGroup.check`: ranks holding different weights raise on every rank at the first sample."""
    for r in range(WORLD):
        assert ranks[r]["diverged"] in [
            f"rank {r} of {WORLD}: the ranks' {x} differ" for x in ("sampled tokens", "log-probs")
        ]


@pytest.mark.parametrize("name", CONFIGS)
def test_a_request_moved_shard_by_shard_continues_exactly(ranks, single, name):
    """Export with keys and values from one 2-rank engine, import into another: each rank takes its own shard and
    prefills only each request's last sampled token."""
    cfg = CONFIGS[name]
    for r in range(WORLD):
        moved = ranks[r]["moved"][name]
        assert_same_samples(moved["done"], single[name])
        assert moved["prefill_tokens"] == len(PROMPTS)
        for x in moved["exported"]:
            assert x.kv.shard == (r, WORLD)
            assert x.kv.shape[2] == len(kv_heads(cfg, r, WORLD))


@pytest.mark.parametrize("name", CONFIGS)
def test_shards_gathered_continue_on_one_process(ranks, single, name):
    """Between degrees: the ranks' shards joined (`gather_kv`) are what one process caches, and it continues
    from them exactly; a shard given to the wrong engine is refused."""
    cfg = CONFIGS[name]
    exported = [ranks[r]["moved"][name]["exported"] for r in range(WORLD)]
    one = engine(cfg, None)
    for shards in zip(*exported):
        with pytest.raises(ValueError, match="shard"):
            one.import_request(shards[0])
        one.import_request(dataclasses.replace(shards[0], kv=gather_kv([s.kv for s in shards], cfg)))
    assert_same_samples(drain(one), single[name])
    assert one.prefill_tokens == len(PROMPTS)


@pytest.mark.parametrize("name", CONFIGS)
def test_split_and_gather_kv_round_trip(name):
    cfg = CONFIGS[name]
    e = engine(cfg, None)
    add_all(e)
    for _ in range(3):
        e.step()
    kv = e.export_request("b", with_kv=True).kv
    for world in (2, 4):
        shards = split_kv(kv, cfg, world)
        assert [s.shape[2] for s in shards] == [len(kv_heads(cfg, r, world)) for r in range(world)]
        back = gather_kv(shards, cfg)
        assert back.shape == kv.shape and back.shard == (0, 1)
        assert np.array_equal(back.keys, kv.keys) and np.array_equal(back.values, kv.values)
    with pytest.raises(ValueError, match="one shard from each"):
        gather_kv(shards[:1], cfg)


@pytest.mark.parametrize("name", CONFIGS)
def test_shard_state_dict_slices(name):
    """Each rank's slices, by shape and value: query heads by rows of q_proj and columns of o_proj, KV heads by
    rows of k/v_proj (the one KV head held by both ranks), the MLP by rows of gate/up and columns of down; the
    rest whole, as the same tensors (views, no copies)."""
    cfg = CONFIGS[name]
    full = weights(cfg)
    d, kv, hq, inter = cfg.head_dim, cfg.num_kv_heads, cfg.num_heads // WORLD, cfg.intermediate_size // WORLD
    shards = [shard_state_dict(full, cfg, r, WORLD) for r in range(WORLD)]
    for r, shard in enumerate(shards):
        assert shard.keys() == full.keys()
        heads = kv_heads(cfg, r, WORLD)
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            q = shard[p + "self_attn.q_proj.weight"]
            assert q.shape == (hq * d, cfg.hidden_size)
            assert torch.equal(q, full[p + "self_attn.q_proj.weight"][r * hq * d : (r + 1) * hq * d])
            k = shard[p + "self_attn.k_proj.weight"]
            assert k.shape == (max(1, kv // WORLD) * d, cfg.hidden_size)
            assert torch.equal(k, full[p + "self_attn.k_proj.weight"][heads.start * d : heads.stop * d])
            o = shard[p + "self_attn.o_proj.weight"]
            assert torch.equal(o, full[p + "self_attn.o_proj.weight"][:, r * hq * d : (r + 1) * hq * d])
            gate, down = shard[p + "mlp.gate_proj.weight"], shard[p + "mlp.down_proj.weight"]
            assert gate.shape == (inter, cfg.hidden_size) and down.shape == (cfg.hidden_size, inter)
            assert torch.equal(gate, full[p + "mlp.gate_proj.weight"][r * inter : (r + 1) * inter])
            assert torch.equal(down, full[p + "mlp.down_proj.weight"][:, r * inter : (r + 1) * inter])
            if cfg.o_bias:
                assert shard[p + "self_attn.o_proj.bias"] is full[p + "self_attn.o_proj.bias"]
            if cfg.mlp_bias:
                assert shard[p + "mlp.down_proj.bias"] is full[p + "mlp.down_proj.bias"]
                assert shard[p + "mlp.gate_proj.bias"].shape == (inter,)
        for name_ in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
            assert shard[name_] is full[name_]
        assert all(
            v.untyped_storage().data_ptr() == full[k].untyped_storage().data_ptr() for k, v in shard.items()
        )
    # the ranks' rows together are the whole matrix, but for a KV head both ranks hold
    for part, dim in (
        ("self_attn.q_proj.weight", 0),
        ("self_attn.o_proj.weight", 1),
        ("mlp.up_proj.weight", 0),
    ):
        name_ = "model.layers.1." + part
        assert torch.equal(torch.cat([s[name_] for s in shards], dim), full[name_])
    k_name = "model.layers.0.self_attn.k_proj.weight"
    joined = torch.cat([s[k_name] for s in shards])
    assert (
        torch.equal(joined, full[k_name]) if kv >= WORLD else torch.equal(joined, full[k_name].repeat(2, 1))
    )
    assert shard_spec("model.norm.weight", cfg, 1, WORLD) is None
    assert shard_state_dict(full, cfg, 0, 1) is full


def test_a_ranks_columns_are_copied_whole_then_sliced():
    """o_proj's and down_proj's columns are strided on the host: a rank stages the whole tensor in one buffer,
    grown only for a larger tensor, and slices it where it lives."""
    cfg = CONFIGS["llama"]
    full = weights(cfg)
    name = "model.layers.0.mlp.down_proj.weight"
    columns = shard_state_dict(full, cfg, 1, WORLD)[name]
    assert not columns.is_contiguous()  # what sends the engine's load through staged_copy
    buffer, flat = staged_copy(None, full[name], torch.device("cpu"))
    assert torch.equal(flat.view(full[name].shape).narrow(*shard_spec(name, cfg, 1, WORLD)), columns)
    small = full["model.layers.0.self_attn.o_proj.weight"]
    again, flat = staged_copy(buffer, small, torch.device("cpu"))
    assert again is buffer and torch.equal(flat.view(small.shape), small)  # reused, not grown


def test_degrees_that_do_not_divide_are_clear_errors():
    cfg = CONFIGS["llama"]  # 4 heads, 2 KV heads, intermediate 128
    check_degree(cfg, 4)  # each KV head on two ranks
    with pytest.raises(ValueError, match="num_heads=4 is not divisible"):
        check_degree(cfg, 3)
    with pytest.raises(ValueError, match="num_kv_heads=2"):
        check_degree(dataclasses.replace(cfg, num_heads=6), 3)  # 2 KV heads on 3 ranks
    assert kv_heads(cfg, 3, 4) == range(1, 2) and kv_heads(cfg, 1, 4) == range(0, 1)


def test_one_rank_is_the_plain_engine():
    """A world of one is no tensor parallelism: the plain network and cache."""
    cfg = CONFIGS["qwen2"]
    e = Engine(cfg, tensor_parallel=TPGroup(0, 1), max_model_len=128)
    assert e.tp is None and e.shard_config is cfg and e.runner.shard == (0, 1)
    with pytest.raises(ValueError, match="rank=1, world=1"):
        TPGroup(1, 1)


def test_an_unknown_all_reduce_is_a_clear_error():
    with pytest.raises(ValueError, match="allreduce='mpi': expected one of nccl, symm"):
        TPGroup(0, 2, allreduce="mpi")
    assert TPGroup(0, 2, allreduce="symm") == TPGroup(0, 2, allreduce="symm")  # the buffer is no part of it
