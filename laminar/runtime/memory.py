"""What a run's parts will hold in memory, estimated from the config and the model directory before anything
starts, against what the machine has: a configuration that cannot fit says so in one line at the start instead of
swapping, or being killed, minutes later.

    KV cache per replica = layers x 2 (keys, values) x KV heads x head dim x block_size x kv_blocks x dtype bytes
    weights per replica  = parameters x dtype bytes (bf16 on CUDA or with model.dtype=bfloat16, else fp32)
                           [+ the adapted weights' base again with trainer.lora_publish=adapters]
                           (with rollout.tensor_parallel=N, per rank: its KV heads' share of the cache, the
                           embedding and lm_head whole and the rest of the parameters / N)
    trainer per rank     = parameters x (4 fp32 weights + 4 gradients + 8 AdamW moments [+ 2 bf16 copy on CUDA]
                           [+ the reference's copy with trainer.kl_coef]) / ranks; LoRA: the frozen fp32 base
                           [+ with several ranks, the fp32 gradient of the largest FSDP unit whole before its
                           reduce-scatter: the embedding and lm_head, the root's]
                           (trainer.cpu_offload: the weights, gradients and moments, 16 bytes a parameter over
                           the ranks, in host memory; on the GPU the root unit's bf16 weights and fp32 gradient)
                           + a micro-batch's activations: tokens x (layers x (6 hidden + 4 intermediate) x dtype
                           bytes + vocabulary x 3 x 4 bytes: the fp32 logits, log-softmax and their gradient);
                           with trainer.activation_checkpointing each layer keeps only its input (hidden x dtype
                           bytes a token a layer) and one layer's whole activations live at a time
    relay slots          = relay.slots x parameters x the published dtype's bytes, in shared memory, per relay
                           (LoRA adapters published alone: their rank x (in + out) numbers a projection)
    publish slots        = as many again, the trainer's own (made and page-locked at its start), on its machine

and each process's own footprint (torch, transformers and Ray's worker: `PROCESS_BYTES`). A micro-batch's tokens
are `trainer.micro_batch_tokens` when set, else `trainer.micro_batch` sequences of twice `rollout.max_new_tokens`
(a prompt taken as long as the longest response). On the 2-core box, SmolLM2-135M's trainer on 2 groups of 4
sequences of up to 166 tokens peaked at 3.6 GiB with micro-batches of 4 (estimated 3.75) and 4.5 GiB with 8
(estimated 5.0)."""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1 << 30
PROCESS_BYTES = GIB // 2  # a replica's or trainer rank's process before its model: Python, torch, Ray
RELAY_PROCESS_BYTES = GIB // 8  # a relay's (no model)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes each part holds; `relays` is how many relays the local machine runs (master and the rollouts')."""

    kv_per_replica: int  # per rank of a tensor-parallel replica
    weights_per_replica: int  # likewise
    trainer_state: int  # per rank: weights, gradients, optimizer (and the bf16 copy, the reference)
    trainer_activations: int  # per rank: one micro-batch's
    relay_slots: int  # per relay
    replicas: int
    ranks: int
    relays: int
    cuda: bool
    replica_ranks: int = 1  # rollout.tensor_parallel: the processes (GPUs) of one replica
    # per rank, in host memory: the weights, gradients and optimizer of a trainer with `trainer.cpu_offload`
    trainer_offloaded: int = 0

    @property
    def replica_processes(self) -> int:
        return self.replicas * self.replica_ranks

    @property
    def replica(self) -> int:
        return self.kv_per_replica + self.weights_per_replica + (0 if self.cuda else PROCESS_BYTES)

    @property
    def trainer_per_rank(self) -> int:
        return self.trainer_state + self.trainer_activations + (0 if self.cuda else PROCESS_BYTES)

    @property
    def publish_slots(self) -> int:
        """The trainer's publish slots: as many versions as a relay holds."""
        return self.relay_slots

    @property
    def host(self) -> int:
        """What the machine's memory holds: everything on CPU; on CUDA the processes, the relay and publish
        slots and an offloaded trainer's state."""
        relays = self.relays * (self.relay_slots + RELAY_PROCESS_BYTES) + self.publish_slots
        if self.cuda:
            offloaded = self.ranks * self.trainer_offloaded
            return relays + offloaded + (self.replica_processes + self.ranks) * PROCESS_BYTES
        return self.replica_processes * self.replica + self.ranks * self.trainer_per_rank + relays

    def line(self) -> str:
        where = "GPU" if self.cuda else "host"
        each = (
            "per replica" if self.replica_ranks == 1 else f"per replica rank ({self.replica_ranks} a replica)"
        )
        return (
            f"memory estimate ({where}): {each} {gib(self.replica)} (KV cache {gib(self.kv_per_replica)}, "
            f"weights {gib(self.weights_per_replica)}) x {self.replica_processes}, per trainer rank "
            f"{gib(self.trainer_per_rank)} (weights, gradients and optimizer {gib(self.trainer_state)}, "
            f"activations {gib(self.trainer_activations)}"
            + (f"; {gib(self.trainer_offloaded)} offloaded to the host" if self.trainer_offloaded else "")
            + f") x {self.ranks}, relay slots {gib(self.relay_slots)} x {self.relays} and the trainer's "
            f"publish slots {gib(self.publish_slots)}: {gib(self.host)} of host memory in all"
        )


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def estimate(cfg: Any, shape: Any, parameters: int, cuda: bool) -> MemoryEstimate:
    """The estimate for the run `cfg` of a model of `shape` (`laminar.engine.config.ModelConfig`) with
    `parameters` elements; a pure function of its arguments."""
    r, t = cfg.rollout, cfg.trainer
    half = cuda or cfg.model.dtype == "bfloat16"  # the replicas' dtype, and the published weights'
    engine_bytes = 2 if half else 4
    kv = (
        shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * r.block_size * r.kv_blocks * engine_bytes
    )
    if t.lora_rank > 0:  # the frozen base in fp32; adapters and their optimizer are small beside it
        per_param = 4.0
    else:
        per_param = (16 + (2 if cuda else 0)) / t.num_workers
    if t.kl_coef > 0:
        per_param += 2 if cuda else 4
    embeddings = shape.vocab_size * shape.hidden_size * (1 if shape.tie_word_embeddings else 2)
    unit_gradient = embeddings * 4 if t.num_workers > 1 and t.lora_rank == 0 else 0
    state, offloaded = int(parameters * per_param) + unit_gradient, 0
    # offloaded: the GPU holds a unit at a time, the root's the largest
    if t.cpu_offload and cuda and t.lora_rank == 0:
        state, offloaded = embeddings * (2 + 4), parameters * 16 // t.num_workers
        if t.kl_coef > 0:  # the reference stays sharded on the GPU
            state += parameters * 2 // t.num_workers
    tokens = t.micro_batch_tokens or t.micro_batch * 2 * r.max_new_tokens
    act_bytes = 2 if cuda else 4
    layer = (6 * shape.hidden_size + 4 * shape.intermediate_size) * act_bytes
    if t.activation_checkpointing:  # saved inputs of every layer, one layer recomputed in the backward
        per_token = shape.num_layers * shape.hidden_size * act_bytes + layer
    else:
        per_token = shape.num_layers * layer
    per_token += shape.vocab_size * 3 * 4
    published, replica_weights = parameters, parameters
    if t.publishes_adapters:  # the replicas keep the base of the adapted weights beside them
        projections = adapted_projections(shape, t.lora_target_modules)
        published = shape.num_layers * sum(t.lora_rank * (i + o) for i, o in projections)
        replica_weights += shape.num_layers * sum(i * o for i, o in projections)
    n = r.tensor_parallel
    if n > 1:  # one rank's share: its KV heads, the embedding and lm_head whole, the rest split
        kv = kv * max(1, shape.num_kv_heads // n) // shape.num_kv_heads
        replica_weights = embeddings + max(0, replica_weights - embeddings) // n
    return MemoryEstimate(
        kv_per_replica=kv,
        weights_per_replica=replica_weights * engine_bytes,
        trainer_state=state,
        trainer_offloaded=offloaded,
        trainer_activations=tokens * per_token,
        relay_slots=cfg.relay.slots * published * engine_bytes,
        replicas=r.replicas,
        ranks=t.num_workers,
        relays=1 if cfg.run.ray_address else 2,
        cuda=cuda,
        replica_ranks=n,
    )


def adapted_projections(shape: Any, targets: list[str]) -> list[tuple[int, int]]:
    """(in, out) of each projection of a decoder layer that LoRA adapts: those of `targets` among the attention's
    and the MLP's (`all-linear`: every one)."""
    h, i = shape.hidden_size, shape.intermediate_size
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    sizes = {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    return [size for name, size in sizes.items() if "all-linear" in targets or name in targets]


def too_big(est: MemoryEstimate, host_available: int, gpu_total: int | None, cfg: Any) -> str | None:
    """The one line saying which part does not fit what the machine has (None when all do): the host's
    available memory for a local run's host share, and on CUDA each replica's and trainer rank's GPU share
    (`num_gpus` of one GPU's memory)."""
    r, t = cfg.rollout, cfg.trainer
    if est.cuda and gpu_total:
        replica_share = gpu_total * min(r.num_gpus or 1.0, 1.0)
        if est.replica > replica_share:
            return (
                f"a replica{' rank' if est.replica_ranks > 1 else ''} needs about {gib(est.replica)} (KV cache "
                f"{gib(est.kv_per_replica)}) and its "
                f"share of a GPU (rollout.num_gpus={r.num_gpus:g}) is {gib(int(replica_share))}: lower "
                "rollout.kv_blocks or give each replica more of a GPU"
            )
        rank_share = gpu_total * min(t.num_gpus or 1.0, 1.0)
        if est.trainer_per_rank > rank_share:
            return (
                f"a trainer rank needs about {gib(est.trainer_per_rank)} and its share of a GPU "
                f"(trainer.num_gpus={t.num_gpus:g}) is {gib(int(rank_share))}: lower trainer.micro_batch_tokens, "
                "or use more trainer.num_workers, trainer.cpu_offload=true (with several) or trainer.lora_rank"
            )
    if not cfg.run.ray_address and est.host > host_available:
        return (
            f"the run needs about {gib(est.host)} of host memory and {gib(host_available)} is available: "
            "lower rollout.kv_blocks, rollout.replicas, trainer.micro_batch or relay.slots"
            + ("" if est.cuda else ", or train on a GPU")
        )
    return None


# ---- what the machine and the model directory say ----------------------------------------------------------
def parameter_count(model_dir: str | Path) -> int:
    """Elements of every tensor in the directory's safetensors files, read from their headers (no tensor is
    loaded); 0 when it has none (e.g. only pytorch_model.bin)."""
    total = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        with open(f, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
        total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
    return total


def host_available() -> int:
    """MemAvailable of /proc/meminfo (free plus what the kernel can reclaim), else the physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class DoesNotFit(ValueError):
    """The memory estimate says a part of the run cannot fit (`run.check_memory=false` starts it anyway)."""


def check_memory(cfg: Any, model_dir: str | Path, cuda: bool) -> tuple[str, str | None]:
    """(the estimate's line, the warning or None) for the run `cfg` on this machine; raises `DoesNotFit` in
    place of the warning while `run.check_memory` is on."""
    from laminar.engine.config import ModelConfig

    est = estimate(cfg, ModelConfig.from_dir(model_dir), parameter_count(model_dir), cuda)
    gpu_total = None
    if cuda:
        import torch

        if torch.cuda.is_available():  # a cluster's driver may have no GPU of its own
            gpu_total = torch.cuda.get_device_properties(0).total_memory
    reason = too_big(est, host_available(), gpu_total, cfg)
    if reason and cfg.run.check_memory:
        raise DoesNotFit(f"{reason} (or run.check_memory=false to start it anyway)")
    return est.line(), f"warning: {reason}" if reason else None
