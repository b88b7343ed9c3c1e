"""What each rank of a 2-rank gloo tensor-parallel replica's engine does in `test_tensor_parallel` (spawned
processes, no Ray): rank 0 drives a `Leader` as its replica would, rank 1 follows it."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from laminar.engine.tensor_parallel import TPGroup
from laminar.relay.pull import SlotReader
from laminar.rollout.tensor_parallel import Channel, Leader, follow
from tests.engine.tp_ranks import CONFIGS, MOVE_AFTER, PROMPTS, add_all, drain, engine
from tests.gloo_ranks import join_gloo

CFG = CONFIGS["llama"]  # two KV heads, one a rank
SLOT_VERSION = 1


def slot_file(out: Path) -> Path:
    return out / "slot.bin"


def moved_from(src, dst) -> dict:
    """Every request of the workload a few steps on `src`, then moved with its keys and values to `dst`."""
    add_all(src)
    for _ in range(MOVE_AFTER):
        src.step()
    before = dst.prefill_tokens
    exported = [pickle.loads(pickle.dumps(src.export_request(rid, with_kv=True))) for rid in PROMPTS]
    for x in exported:
        dst.import_request(x)
    return {
        "done": drain(dst),
        "prefill_tokens": dst.prefill_tokens - before,
        "shards": [x.kv.shard for x in exported],
    }


def rank_main(rank: int, world: int, port: int, out: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    join_gloo(rank, world, port)
    channel = Channel.join(rank, world, idle_s=60)
    tp = TPGroup(rank, world, check=True)  # every step's tokens and log-probs compared across the ranks
    mine = engine(CFG, tp)
    if rank != 0:
        follow(mine, channel, SlotReader(None))  # ends the process when rank 0's does
    leader = Leader(mine, channel, SlotReader(None), [os.getpid()])
    results = {}
    add_all(leader)
    results["generated"] = drain(leader)
    path = slot_file(Path(out))
    layout = pickle.loads((Path(out) / "layout.pkl").read_bytes())
    leader.load_slot(
        str(path), path.stat().st_size, layout, SLOT_VERSION
    )  # each rank maps it, takes its slices
    results["version"] = leader.version
    add_all(leader)
    results["slot"] = drain(leader)
    one = engine(CFG, None)  # a single-process engine beside it, on the slot's weights
    SlotReader(None).load(one.load_weights, str(path), path.stat().st_size, layout, SLOT_VERSION)
    results["to_one"] = moved_from(leader, one)  # TP=2 -> TP=1: the ranks' KV heads joined
    results["from_one"] = moved_from(one, leader)  # TP=1 -> TP=2: split, each rank its heads
    (Path(out) / "rank0.pkl").write_bytes(pickle.dumps(results))
    sys.stdout.flush()
    os._exit(0)
