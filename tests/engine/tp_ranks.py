"""What each rank of a 2-rank gloo tensor-parallel engine does in `test_tensor_parallel` (spawned processes, no
Ray), and the workloads, which the test also runs on one process for the reference."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from laminar.engine import Engine, ModelConfig, SamplingParams, flatten_state_dict
from laminar.engine.model import CausalLM
from laminar.engine.tensor_parallel import TPGroup
from tests.gloo_ranks import finish_rank, join_gloo

SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, max_position_embeddings=256)
CONFIGS = {
    # every bias: o_proj's and down_proj's are added once, after the all-reduce
    "llama": ModelConfig(
        "llama", **SHAPE, num_heads=4, num_kv_heads=2, head_dim=16, qkv_bias=True, o_bias=True, mlp_bias=True
    ),
    # one KV head, held whole by both ranks; lm_head tied to the embedding
    "qwen2": ModelConfig(
        "qwen2", **SHAPE, num_heads=4, num_kv_heads=1, head_dim=16, qkv_bias=True, tie_word_embeddings=True
    ),
    # per-head norms on q and k
    "qwen3": ModelConfig("qwen3", **SHAPE, num_heads=4, num_kv_heads=2, head_dim=32, qk_norm=True),
}
# the requests of every run: prompts of different lengths, two sharing a prompt, seeded and greedy
PROMPTS = {
    "a": [5, 6, 7],
    "b": list(range(20, 32)),
    "c": list(range(40, 47)),
    "c2": list(range(40, 47)),
    "d": list(range(60, 80)),
    "g": list(range(90, 99)),
}
PARAMS = {
    rid: SamplingParams(temperature=0.0 if rid == "g" else 1.0, max_new_tokens=14, ignore_eos=True, seed=i)
    for i, rid in enumerate(PROMPTS)
}
ENGINE = dict(max_model_len=128, block_size=4, max_num_seqs=8)
MOVE_AFTER = 5  # steps on the first engine before every request moves with its keys and values


def weights(cfg: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """A random full state dict (matrices N(0, 0.2), so samples vary), norms and biases random too (a norm or bias
    sliced wrongly shows)."""
    torch.manual_seed(seed)
    state = {k: v.detach().clone() for k, v in CausalLM(cfg).state_dict().items()}
    for k, v in state.items():
        if "norm" in k or k.endswith("bias"):
            v.add_(torch.randn_like(v) * 0.1)
        else:
            v.normal_(0, 0.2)
    return state


def engine(cfg: ModelConfig, tp: TPGroup | None, **kw) -> Engine:
    """Weights through the relay's entry: the whole flat buffer on every rank."""
    e = Engine(cfg, tensor_parallel=tp, **ENGINE, **kw)
    layout, flat = flatten_state_dict(weights(cfg))
    e.load_weights(flat, layout, version=0)
    return e


def add_all(e: Engine) -> None:
    for rid, prompt in PROMPTS.items():
        e.add_request(rid, prompt, PARAMS[rid])


def drain(e: Engine) -> dict[str, tuple[list[int], list[float]]]:
    done = {}
    while e.has_unfinished():
        for f in e.step().finished:
            done[f.request_id] = (f.output_token_ids, f.logprobs)
    return done


def generate(cfg: ModelConfig, tp: TPGroup | None, **kw) -> dict[str, tuple[list[int], list[float]]]:
    e = engine(cfg, tp, **kw)
    add_all(e)
    return drain(e)


def move(cfg: ModelConfig, tp: TPGroup | None) -> dict:
    """Every request runs a few steps on one engine, moves with its keys and values to another (pickled, as
    between processes) and finishes there."""
    src, dst = engine(cfg, tp), engine(cfg, tp)
    add_all(src)
    for _ in range(MOVE_AFTER):
        src.step()
    exported = [pickle.loads(pickle.dumps(src.export_request(rid, with_kv=True))) for rid in PROMPTS]
    for x in exported:
        dst.import_request(x)
    return {"done": drain(dst), "prefill_tokens": dst.prefill_tokens, "exported": exported}


def diverged(tp: TPGroup) -> str:
    """Ranks given different weights: the check stops every rank at the first sample, naming what differs."""
    e = Engine(CONFIGS["qwen3"], tensor_parallel=tp, **ENGINE)
    e.load_state_dict(weights(CONFIGS["qwen3"], seed=tp.rank), version=0)
    e.add_request("a", PROMPTS["a"], PARAMS["a"])
    try:
        e.step()
    except AssertionError as err:
        return str(err)
    return "no error"


def rank_main(rank: int, world: int, port: int, out: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    join_gloo(rank, world, port)
    try:
        tp = TPGroup.of(check=True)  # every step's tokens and log-probs compared across the ranks
        results = {name: generate(cfg, tp) for name, cfg in CONFIGS.items()}
        results["llama-pipelined"] = generate(CONFIGS["llama"], tp, pipeline=True)
        results["moved"] = {name: move(cfg, tp) for name, cfg in CONFIGS.items()}
        results["diverged"] = diverged(tp)
        (Path(out) / f"rank{rank}.pkl").write_bytes(pickle.dumps(results))
    except BaseException:
        dist.destroy_process_group()
        raise
    finish_rank()
