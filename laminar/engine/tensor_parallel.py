"""Tensor parallelism: one engine run by N processes (ranks) in lockstep, each holding a shard of the network.

Megatron's pattern. Attention is split by heads: each rank holds its query heads' rows of q_proj, its KV heads'
rows of k_proj and v_proj (a KV head held by several ranks when there are fewer KV heads than ranks), the matching
columns of o_proj, and only its KV heads in its cache. The MLP is split by the intermediate dimension: rows of
gate_proj and up_proj, columns of down_proj. o_proj and down_proj each end in one all-reduce (their biases added
once, after it). Embeddings, norms and lm_head are replicated: every rank computes the same hidden states and
logits (the all-reduce gives every rank the same sum) and so draws the same token from the request's
counter-based stream, with nothing broadcast. Every rank must make the same engine calls with the same arguments
in the same order; the engine is deterministic given them, so the ranks' collectives line up.

Weights arrive whole on every rank (the relay's flat buffer) and each keeps its slices (`shard_state_dict`, views,
no copies). A request's keys and values move shard by shard between engines of the same degree; `gather_kv` and
`split_kv` turn the shards of one degree into those of another.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from laminar.engine.config import ModelConfig
from laminar.engine.sequence import MovedKV

ALLREDUCE = ("nccl", "symm")
SYMM_BYTES = (
    8 << 20
)  # the symmetric buffer: a decode step's activations up to batch 512 at hidden 8192 in bf16


@dataclass(frozen=True)
class TPGroup:
    """This process's place among the ranks that run one engine together. `check`: every sampled token and
    log-prob is compared across the ranks (two small all-reduces a step; tests and debugging). `graphs`: on CUDA,
    decode steps are captured in CUDA graphs with their NCCL all-reduces inside (5x faster than eager steps for
    Qwen2.5-7B at TP=2, `results/tp-decode/`); False decodes eagerly. `allreduce`: "nccl", or "symm": on CUDA, a
    tensor of at most `SYMM_BYTES` (a decode step's activations) is summed by a one-shot all-reduce through
    PyTorch's symmetric memory (every rank reads the others' buffers over NVLink: no NCCL launch, no multicast),
    and a larger one (a prefill's) by NCCL; the buffer is made at the first call, which every rank makes at the
    same point of the same engine calls."""

    rank: int
    world: int
    group: dist.ProcessGroup | None = None  # None: the default process group
    check: bool = False
    graphs: bool = True
    allreduce: str = "nccl"
    _symm: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"TPGroup rank={self.rank}, world={self.world}: expected 0 <= rank < world")
        if self.allreduce not in ALLREDUCE:
            raise ValueError(f"TPGroup allreduce={self.allreduce!r}: expected one of {', '.join(ALLREDUCE)}")

    @classmethod
    def of(cls, group: dist.ProcessGroup | None = None, check: bool = False) -> TPGroup:
        """This process's rank and the size of `group` (the default one: `init_process_group`'s)."""
        return cls(dist.get_rank(group), dist.get_world_size(group), group, check)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place; every rank gets the same bits."""
        if self.allreduce == "symm" and x.is_cuda and x.numel() * x.element_size() <= SYMM_BYTES:
            return self._symm_all_reduce(x)
        dist.all_reduce(x, group=self.group)
        return x

    def _symm_all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed._symmetric_memory as symm_mem

        s = self._symm
        if not s:  # the first call, outside any graph capture (the engine warms up before it captures)
            name = (self.group or dist.group.WORLD).group_name
            if hasattr(symm_mem, "enable_symm_mem_for_group"):
                symm_mem.enable_symm_mem_for_group(name)
            buf = symm_mem.empty(SYMM_BYTES, dtype=torch.uint8, device=x.device)
            symm_mem.rendezvous(buf, name)
            s.update(buf=buf, name=name)
        staged = s["buf"][: x.numel() * x.element_size()].view(x.dtype)
        staged.copy_(x.reshape(-1))
        torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", s["name"], out=x.view(-1))
        return x

    def agree_min(self, n: int, device: torch.device) -> int:
        """The least of every rank's `n` (free memory differs between devices; the cache size must not)."""
        t = torch.tensor([n], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def check_same(self, x: torch.Tensor, what: str) -> None:
        """Raise on every rank at once if `x` differs between them."""
        lo, hi = x.clone(), x.clone()
        dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=self.group)
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=self.group)
        if not torch.equal(lo, hi):
            raise AssertionError(f"rank {self.rank} of {self.world}: the ranks' {what} differ")


def check_degree(cfg: ModelConfig, world: int) -> None:
    """Whether `world` ranks can split this model: whole query heads and MLP columns a rank, and KV heads either
    split evenly or each replicated on a whole number of ranks."""
    if world < 1:
        raise ValueError(f"tensor_parallel world={world}; expected >= 1")
    if cfg.num_heads % world:
        raise ValueError(f"num_heads={cfg.num_heads} is not divisible by tensor_parallel world={world}")
    kv = cfg.num_kv_heads
    if kv % world and world % kv:
        raise ValueError(
            f"num_kv_heads={kv} and tensor_parallel world={world}: one must divide the other (KV heads split "
            "evenly, or each replicated on world / num_kv_heads ranks)"
        )
    if cfg.intermediate_size % world:
        raise ValueError(
            f"intermediate_size={cfg.intermediate_size} is not divisible by tensor_parallel world={world}"
        )


def local_config(cfg: ModelConfig, world: int) -> ModelConfig:
    """The shape one rank's network has: its query heads, KV heads and MLP columns."""
    if world == 1:
        return cfg
    check_degree(cfg, world)
    return dataclasses.replace(
        cfg,
        num_heads=cfg.num_heads // world,
        num_kv_heads=max(1, cfg.num_kv_heads // world),
        intermediate_size=cfg.intermediate_size // world,
    )


def query_heads(cfg: ModelConfig, rank: int, world: int) -> range:
    per = cfg.num_heads // world
    return range(rank * per, (rank + 1) * per)


def kv_heads(cfg: ModelConfig, rank: int, world: int) -> range:
    """The KV heads rank `rank` holds: its query heads' groups (one head, shared with other ranks, when there are
    fewer KV heads than ranks)."""
    kv = cfg.num_kv_heads
    if kv >= world:
        per = kv // world
        return range(rank * per, (rank + 1) * per)
    head = rank * kv // world
    return range(head, head + 1)


# name within a layer -> (dimension split, what it is split by); absent names are replicated. o_proj's and
# down_proj's biases are replicated: added once, after the all-reduce.
SPLITS = {
    "self_attn.q_proj.weight": (0, "q"),
    "self_attn.q_proj.bias": (0, "q"),
    "self_attn.k_proj.weight": (0, "kv"),
    "self_attn.k_proj.bias": (0, "kv"),
    "self_attn.v_proj.weight": (0, "kv"),
    "self_attn.v_proj.bias": (0, "kv"),
    "self_attn.o_proj.weight": (1, "q"),
    "mlp.gate_proj.weight": (0, "mlp"),
    "mlp.gate_proj.bias": (0, "mlp"),
    "mlp.up_proj.weight": (0, "mlp"),
    "mlp.up_proj.bias": (0, "mlp"),
    "mlp.down_proj.weight": (1, "mlp"),
}


def shard_spec(name: str, cfg: ModelConfig, rank: int, world: int) -> tuple[int, int, int] | None:
    """Rank `rank`'s part of the Hugging Face tensor `name` as (dimension, start, length), or None when every
    rank holds it whole. What the relay needs to send each rank only its slices."""
    parts = name.split(".", 3)
    if world == 1 or parts[:2] != ["model", "layers"] or len(parts) < 4 or parts[3] not in SPLITS:
        return None
    dim, by = SPLITS[parts[3]]
    if by == "mlp":
        per = cfg.intermediate_size // world
        return dim, rank * per, per
    heads = query_heads(cfg, rank, world) if by == "q" else kv_heads(cfg, rank, world)
    return dim, heads.start * cfg.head_dim, len(heads) * cfg.head_dim


def shard_state_dict(
    weights: dict[str, torch.Tensor], cfg: ModelConfig, rank: int, world: int
) -> dict[str, torch.Tensor]:
    """Rank `rank`'s shard of a full Hugging Face state dict, under the same names: views (`narrow`), no copies."""
    check_degree(cfg, world)
    if world == 1:
        return weights
    out = {}
    for name, t in weights.items():
        spec = shard_spec(name, cfg, rank, world)
        out[name] = t if spec is None else t.narrow(*spec)
    return out


# ---- moved keys and values between degrees ---------------------------------------------------------------
def _heads(data: np.ndarray, kv: MovedKV) -> np.ndarray:
    """Raw bytes [layers, tokens, heads, head_dim * itemsize]: heads slice and join without knowing the dtype."""
    layers, tokens, heads, _ = kv.shape
    return data.reshape(layers, tokens, heads, -1)


def gather_kv(shards: list[MovedKV], cfg: ModelConfig) -> MovedKV:
    """The whole keys and values of a request from its shards, one a rank of the engine that exported it."""
    world = len(shards)
    if sorted(s.shard for s in shards) != [(r, world) for r in range(world)]:
        raise ValueError(
            f"gather_kv needs one shard from each of {world} ranks; got {sorted(s.shard for s in shards)}"
        )
    by_rank = sorted(shards, key=lambda s: s.shard[0])
    first = by_rank[0]
    keys, values = [], []
    for head in range(cfg.num_kv_heads):  # each from the first rank that holds it
        rank = next(r for r in range(world) if head in kv_heads(cfg, r, world))
        s = by_rank[rank]
        i = head - kv_heads(cfg, rank, world).start
        keys.append(_heads(s.keys, s)[:, :, i : i + 1])
        values.append(_heads(s.values, s)[:, :, i : i + 1])
    layers, tokens, _, dim = first.shape
    return MovedKV(
        first.num_tokens,
        (layers, tokens, cfg.num_kv_heads, dim),
        first.dtype,
        np.concatenate(keys, axis=2).reshape(-1),
        np.concatenate(values, axis=2).reshape(-1),
    )


def split_kv(kv: MovedKV, cfg: ModelConfig, world: int) -> list[MovedKV]:
    """Whole keys and values (`gather_kv`, or an engine of one rank) as the shards of `world` ranks."""
    if kv.shard != (0, 1):
        raise ValueError(f"split_kv takes whole keys and values; this is shard {kv.shard} (gather_kv first)")
    check_degree(cfg, world)
    layers, tokens, _, dim = kv.shape
    out = []
    for rank in range(world):
        h = kv_heads(cfg, rank, world)
        take = [
            np.ascontiguousarray(_heads(d, kv)[:, :, h.start : h.stop]).reshape(-1)
            for d in (kv.keys, kv.values)
        ]
        out.append(
            MovedKV(kv.num_tokens, (layers, tokens, len(h), dim), kv.dtype, *take, shard=(rank, world))
        )
    return out
