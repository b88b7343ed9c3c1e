"""The cost model: every time the simulator charges comes from here, with every constant in one dataclass.

Decode and prefill follow a roofline (bytes over bandwidth, FLOPs over compute, each with an efficiency);
training is 6 x parameters x tokens over achieved FLOP/s; weights move either by a GPU-side global broadcast
(the baselines) or by device-to-host copy, a pipelined relay chain and a host-to-device pull (Laminar).

Sources of the defaults (replace them with measurements: `CostModel.from_measurements`):
- H100 SXM / H800: 989 TFLOP/s dense BF16, 3.35 TB/s HBM3, 80 GB (NVIDIA H100 datasheet; H800 differs only in
  NVLink, which decode at TP <= 4 barely uses). H200: same compute, 4.8 TB/s, 141 GB (H200 datasheet).
- Host <-> GPU: 55 GB/s from pinned or registered memory, 8 GB/s from pageable (design section 4, measured on
  an H200 host).
- Trainer publish: the paper's actor stall, 0.64 s for 32B and 1.40 s for 72B BF16 weights, is about 100 GB/s
  of host copy bandwidth (several GPUs copying their shards at once into one host's memory).
- Network: 8 x 400 Gb/s InfiniBand per machine for GPU collectives; a relay is one CPU process per machine on
  one 200 Gb/s NIC (25 GB/s line rate, about 20 GB/s achieved by a TCP stream).
- Efficiencies: decode reaches about 70% of HBM bandwidth and prefill about 50% of peak compute in vLLM-class
  engines; RL training with long sequences reaches about 35% MFU (FSDP2 / Megatron reports).
- Trainer: `train_s` = fixed `train_step_overhead_s` + 6 x params x tokens / achieved FLOP/s. On our small GPU
  run (0.5B, 1 trainer GPU) the per-step records give 2.29 s fixed and 3.9 +- 2.6 us a token
  (`calibrate.fit_trainer`, results/sim/validation.md); the 2.0 s default is for the paper-scale models.
- Repack overhead 0.69 s per repack (the paper's measurement); re-prefill is charged as prefill of the tokens
  a trajectory already has.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    """What the cost model needs of a transformer: size, layers and the KV bytes one token occupies."""

    name: str
    params: float
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    rollout_tp: int
    bytes_per_param: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param


# Qwen2.5 configurations (Hugging Face config.json of each model); rollout TP is the smallest that leaves
# room for a useful KV cache on an 80 GB card.
MODELS: dict[str, ModelSpec] = {
    "0.5B": ModelSpec("0.5B", 0.49e9, 24, 896, 2, 64, rollout_tp=1),
    "7B": ModelSpec("7B", 7.6e9, 28, 3584, 4, 128, rollout_tp=1),
    "32B": ModelSpec("32B", 32.8e9, 64, 5120, 8, 128, rollout_tp=2),
    "72B": ModelSpec("72B", 72.7e9, 80, 8192, 8, 128, rollout_tp=4),
}


@dataclass(frozen=True)
class CostModel:
    """All constants of the simulated hardware and software, and the times they imply."""

    # GPU (H100 SXM / H800 datasheet)
    gpu_flops: float = 989e12
    gpu_hbm_bw: float = 3.35e12
    gpu_memory: float = 80e9
    gpus_per_machine: int = 8
    # engine
    decode_mem_eff: float = 0.70
    decode_compute_eff: float = 0.60
    prefill_compute_eff: float = 0.50
    step_overhead_s: float = 0.004  # scheduler, sampling and launch per decode step (vLLM-class, CUDA graphs)
    # one all-reduce, two a layer and step at TP > 1 (NVLink latency; `laminar simulate` uses the fit to
    # results/tp-decode, 19 us: `laminar.sim.measured.TP_LAYER_LATENCY_S`)
    tp_layer_latency_s: float = 8e-6
    kv_memory_frac: float = 0.90  # gpu_memory_utilization
    max_num_seqs: int = 256
    kv_block_tokens: int = 16
    # trainer
    train_mfu: float = 0.35
    train_flops_per_param_token: float = 6.0
    train_step_overhead_s: float = 2.0  # optimizer step, gathers, data loading per global step
    # weights on the baseline path: a GPU-side broadcast from the trainer to every rollout GPU
    ib_bw_per_gpu: float = 40e9  # 400 Gb/s NIC per GPU, about 80% achieved by NCCL
    global_sync_overhead_s: float = 1.5  # resharding, pausing engines, NCCL group set-up per update
    collective_hop_latency_s: float = 0.02  # per doubling of participants (tree broadcast)
    # weights on Laminar's path
    publish_bw: float = 100e9  # trainer GPU -> pinned host (calibrated to the paper's actor stall)
    relay_link_bw: float = 20e9  # relay -> relay TCP stream on a 200 Gb/s NIC
    relay_chunk_bytes: float = 64e6
    relay_hop_latency_s: float = 0.001
    h2d_pinned_bw: float = 55e9  # design section 4
    h2d_pageable_bw: float = 8e9  # design section 4 (unregistered memory, for the ablation)
    pull_overhead_s: float = 0.2  # engine pause, cache reset, version swap
    # repack and failures
    repack_overhead_s: float = 0.69  # the paper's measured overhead per repack
    colocate_switch_s: float = 3.0  # verl-style colocation: offload/onload KV and weights per phase switch
    replica_restart_s: float = 240.0  # a replacement replica joins (the paper: about 252 s to recover)
    job_restart_s: float = 600.0  # a baseline restarts the whole job from its last checkpoint

    @classmethod
    def h200(cls) -> CostModel:
        return cls(gpu_hbm_bw=4.8e12, gpu_memory=141e9)

    @classmethod
    def from_measurements(cls, path: str | Path, base: CostModel | None = None) -> CostModel:
        """Override constants with measured ones: a JSON object whose keys are this class's field names
        (an engine benchmark may write more keys; the ones that are not fields are ignored)."""
        base = base or cls()
        data = json.loads(Path(path).read_text())
        data = data.get("cost_model", data)
        names = {f.name for f in fields(cls)}
        return replace(base, **{k: v for k, v in data.items() if k in names})

    # ---- rollout engine ----------------------------------------------------------------------------------

    def kv_capacity_tokens(self, model: ModelSpec) -> int:
        """Tokens of KV cache one replica of `model.rollout_tp` GPUs holds."""
        free = model.rollout_tp * self.gpu_memory * self.kv_memory_frac - model.weight_bytes
        if free <= 0:
            raise ValueError(
                f"model {model.name} does not fit on {model.rollout_tp} GPUs of {self.gpu_memory:.3g} B"
            )
        return int(free / model.kv_bytes_per_token)

    def decode_base_s(self, model: ModelSpec, batch: int) -> float:
        """Part of one decode step that does not depend on context: weights read vs GEMM compute."""
        tp = model.rollout_tp
        mem = model.weight_bytes / tp / (self.gpu_hbm_bw * self.decode_mem_eff)
        compute = 2 * model.params * batch / tp / (self.gpu_flops * self.decode_compute_eff)
        comm = self.tp_layer_latency_s * 2 * model.layers if tp > 1 else 0.0
        return max(mem, compute) + comm + self.step_overhead_s

    def decode_per_context_token_s(self, model: ModelSpec) -> float:
        """Extra time of one decode step per token of context in the batch (reading its KV)."""
        return model.kv_bytes_per_token / model.rollout_tp / (self.gpu_hbm_bw * self.decode_mem_eff)

    def decode_step_s(self, model: ModelSpec, batch: int, context_tokens: float) -> float:
        return self.decode_base_s(model, batch) + self.decode_per_context_token_s(model) * context_tokens

    def prefill_s(self, model: ModelSpec, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        tp = model.rollout_tp
        compute = 2 * model.params * tokens / tp / (self.gpu_flops * self.prefill_compute_eff)
        mem = model.weight_bytes / tp / (self.gpu_hbm_bw * self.decode_mem_eff)
        return max(compute, mem)

    def batch_limit(self, model: ModelSpec, context_tokens: float, frac: float = 0.8) -> int:
        """B: the decode batch past which throughput stops growing, i.e. the smallest batch that reaches
        `frac` of the throughput at `max_num_seqs` (at a typical per-request context)."""

        def throughput(n: int) -> float:
            return n / self.decode_step_s(model, n, n * context_tokens)

        target = frac * throughput(self.max_num_seqs)
        return next(n for n in range(1, self.max_num_seqs + 1) if throughput(n) >= target)

    # ---- trainer -----------------------------------------------------------------------------------------

    def train_s(self, model: ModelSpec, tokens: float, gpus: int) -> float:
        flops = self.train_flops_per_param_token * model.params * tokens
        return flops / (gpus * self.gpu_flops * self.train_mfu) + self.train_step_overhead_s

    # ---- weights -----------------------------------------------------------------------------------------

    def global_broadcast_s(self, model: ModelSpec, rollout_gpus: int) -> float:
        """GPU-side broadcast from the trainer to every rollout GPU (each receives its TP shard)."""
        shard = model.weight_bytes / model.rollout_tp
        hops = math.log2(max(2, rollout_gpus))
        return self.global_sync_overhead_s + shard / self.ib_bw_per_gpu + self.collective_hop_latency_s * hops

    def publish_s(self, model: ModelSpec) -> float:
        """Laminar's actor stall: copy the weights into the pinned buffer shared with the master relay."""
        return model.weight_bytes / self.publish_bw

    def relay_arrival_s(self, model: ModelSpec, position: int) -> float:
        """Time after publish until relay `position` (0 = first after the master) holds the whole version:
        one transfer plus a chunk delay per hop (pipelined chain)."""
        chunk = min(self.relay_chunk_bytes, model.weight_bytes)
        per_hop = chunk / self.relay_link_bw + self.relay_hop_latency_s
        return model.weight_bytes / self.relay_link_bw + position * per_hop

    def pull_s(self, model: ModelSpec, pinned: bool = True) -> float:
        """A rollout copies its shard from its relay's shared memory to each of its GPUs in parallel."""
        bw = self.h2d_pinned_bw if pinned else self.h2d_pageable_bw
        return model.weight_bytes / model.rollout_tp / bw + self.pull_overhead_s
