"""A tensor-parallel replica's engine (`laminar.rollout.tensor_parallel`): rank 0's `Leader` makes every engine
call on both gloo ranks, weights come through a relay slot each rank maps itself, and requests move with their keys
and values to and from an engine of another degree."""

from __future__ import annotations

import pickle
import time

import pytest
import torch.multiprocessing as mp

from laminar.engine import flatten_state_dict
from tests.engine.test_tensor_parallel import assert_same_samples, free_port
from tests.engine.tp_ranks import PROMPTS, add_all, drain, engine, weights
from tests.rollout.leader_ranks import CFG, SLOT_VERSION, rank_main, slot_file

WORLD = 2
TIMEOUT_S = 300  # about 10 s on an idle 2-core machine


@pytest.fixture(scope="module")
def rank0(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("leader")
    layout, flat = flatten_state_dict(weights(CFG, seed=1))  # the version a relay slot holds
    slot_file(out).write_bytes(flat.tobytes())
    (out / "layout.pkl").write_bytes(pickle.dumps(layout))
    ctx = mp.start_processes(
        rank_main, args=(WORLD, free_port(), str(out)), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {WORLD} ranks did not finish within {TIMEOUT_S} s")
    return pickle.loads((out / "rank0.pkl").read_bytes())


def single(seed: int) -> dict:
    e = engine(CFG, None)
    if seed:
        e.load_state_dict(weights(CFG, seed=seed), SLOT_VERSION)
    add_all(e)
    return drain(e)


def test_the_leader_samples_what_one_process_samples(rank0):
    """Every call made on both ranks (each step's tokens compared across them inside the run)."""
    assert_same_samples(rank0["generated"], single(0))


def test_each_rank_takes_its_slices_of_the_slot(rank0):
    """A version from a slot file: both ranks load it (else their samples would differ and the run stop)."""
    assert rank0["version"] == SLOT_VERSION
    assert_same_samples(rank0["slot"], single(1))


@pytest.mark.parametrize("move", ["to_one", "from_one"])
def test_requests_move_between_degrees_with_their_keys_and_values(rank0, move):
    """TP=2 -> TP=1: the ranks' KV heads are joined; TP=1 -> TP=2: they are split, each rank its own. Either way
    the receiver takes the cache over (it prefills only each request's last sampled token) and continues: the
    same tokens as one uninterrupted process, log-probs to 1e-5."""
    moved = rank0[move]
    assert moved["shards"] == [(0, 1)] * len(PROMPTS)  # whole keys and values on the wire
    assert moved["prefill_tokens"] == len(PROMPTS)
    assert_same_samples(moved["done"], single(1))
