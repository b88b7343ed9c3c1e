"""The memory estimate printed at the start: the KV cache, weights, trainer and relay slots against the formula,
and one line when the run cannot fit the machine (the GPU config run on a CPU asks for 5.6 GiB of KV)."""

from __future__ import annotations

import dataclasses
import json
import struct

from laminar.configure import load_config
from laminar.engine.config import ModelConfig
from laminar.runtime.memory import GIB, PROCESS_BYTES, RELAY_PROCESS_BYTES, estimate, parameter_count, too_big

SMOLLM2 = ModelConfig(
    family="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
)
PARAMETERS = 134_515_008  # SmolLM2-135M's safetensors


def test_the_kv_cache_weights_trainer_and_relays_follow_the_formula():
    cfg = load_config(None, ["rollout.kv_blocks=8192", "rollout.replicas=2", "trainer.micro_batch=4"])
    est = estimate(cfg, SMOLLM2, PARAMETERS, cuda=False)
    assert est.kv_per_replica == 30 * 2 * 3 * 64 * 16 * 8192 * 4  # fp32 on CPU: 5.6 GiB
    assert est.weights_per_replica == PARAMETERS * 4
    assert est.replica == est.kv_per_replica + est.weights_per_replica + PROCESS_BYTES
    assert est.trainer_state == PARAMETERS * 16  # fp32 weights, gradients, two AdamW moments
    tokens = 4 * 2 * 48  # micro_batch sequences of twice rollout.max_new_tokens
    assert est.trainer_activations == tokens * (30 * (6 * 576 + 4 * 1536) * 4 + 49152 * 3 * 4)
    assert est.relay_slots == 3 * PARAMETERS * 4 and est.relays == 2
    assert est.publish_slots == est.relay_slots  # the trainer's own, as many versions
    assert est.host == (
        2 * est.replica + est.trainer_state + est.trainer_activations + PROCESS_BYTES
        + 2 * (est.relay_slots + RELAY_PROCESS_BYTES) + est.publish_slots
    )  # fmt: skip
    gpu = estimate(
        load_config(None, ["rollout.kv_blocks=8192", "trainer.micro_batch_tokens=1000"]),
        SMOLLM2,
        PARAMETERS,
        cuda=True,
    )
    assert (
        gpu.kv_per_replica == est.kv_per_replica // 2 and gpu.trainer_state == PARAMETERS * 18
    )  # bf16; its copy
    assert gpu.trainer_activations == 1000 * (30 * (6 * 576 + 4 * 1536) * 2 + 49152 * 3 * 4)
    recomputed = estimate(
        load_config(None, ["trainer.micro_batch_tokens=1000", "trainer.activation_checkpointing=true"]),
        SMOLLM2,
        PARAMETERS,
        cuda=True,
    )  # every layer's input kept, one layer's activations at a time
    assert recomputed.trainer_activations == 1000 * ((30 * 576 + 6 * 576 + 4 * 1536) * 2 + 49152 * 3 * 4)
    assert (
        gpu.host == 2 * (gpu.relay_slots + RELAY_PROCESS_BYTES) + gpu.publish_slots + 4 * PROCESS_BYTES
    )  # GPU memory apart
    sharded = estimate(load_config(None, ["trainer.num_workers=4"]), SMOLLM2, PARAMETERS, cuda=True)
    lm_head = 1 if SMOLLM2.tie_word_embeddings else 2
    # and the root unit's (embedding, lm_head) fp32 gradient, whole before its reduce-scatter
    assert sharded.trainer_state == PARAMETERS * 18 // 4 + 49152 * 576 * lm_head * 4
    # offloaded: the state in host memory, the GPU holding the root unit (bf16 weights, fp32 gradient) at most
    offload = load_config(None, ["trainer.num_workers=4", "trainer.cpu_offload=true"])
    offloaded = estimate(offload, SMOLLM2, PARAMETERS, cuda=True)
    assert offloaded.trainer_state == 49152 * 576 * lm_head * 6
    assert offloaded.trainer_offloaded == PARAMETERS * 16 // 4
    assert offloaded.host == sharded.host + 4 * offloaded.trainer_offloaded
    assert "offloaded to the host" in offloaded.line() and "offloaded" not in sharded.line()
    lora = estimate(
        load_config(None, ["trainer.lora_rank=8", "trainer.kl_coef=0.01"]), SMOLLM2, PARAMETERS, False
    )
    assert lora.trainer_state == PARAMETERS * 8  # the frozen base and the reference
    adapters = estimate(
        load_config(None, ["trainer.lora_rank=8", "trainer.lora_publish=adapters"]),
        SMOLLM2,
        PARAMETERS,
        False,
    )
    qkvo = 576 * 576 * 2 + 576 * 192 * 2  # SmolLM2: 9 query heads, 3 key-value heads of 64
    mlp = 576 * 1536 * 3
    assert adapters.weights_per_replica == (PARAMETERS + 30 * (qkvo + mlp)) * 4  # the adapted base kept
    ranked = 8 * ((576 + 576) * 2 + (576 + 192) * 2 + (576 + 1536) * 3)
    assert adapters.relay_slots == 3 * 30 * ranked * 4  # the adapters alone
    # SmolLM2's 3 KV heads on 3 ranks: a third of the cache a rank, the tied embedding whole, the rest a third
    tied = dataclasses.replace(SMOLLM2, tie_word_embeddings=True)
    overrides = ["rollout.kv_blocks=8192", "rollout.tensor_parallel=3"]
    tp = estimate(load_config(None, overrides), tied, PARAMETERS, True)
    embedding = 49152 * 576
    assert tp.kv_per_replica == gpu.kv_per_replica // 3
    assert tp.weights_per_replica == (embedding + (PARAMETERS - embedding) // 3) * 2
    assert (
        tp.host == 2 * (tp.relay_slots + RELAY_PROCESS_BYTES) + tp.publish_slots + (3 * 3 + 1) * PROCESS_BYTES
    )  # 3 replicas of 3


def test_a_run_that_cannot_fit_is_one_line_naming_what_to_lower():
    gpu_config_on_cpu = load_config(
        "configs/smollm2-arith.yaml", ["model.path=", "model.device=cpu", "model.dtype=float32"]
    )
    est = estimate(gpu_config_on_cpu, SMOLLM2, PARAMETERS, cuda=False)
    assert est.kv_per_replica > 5 * GIB
    warning = too_big(est, 8 * GIB, None, gpu_config_on_cpu)
    assert warning.startswith("the run needs about ") and "8.00 GiB is available" in warning
    assert "rollout.kv_blocks" in warning and "\n" not in warning
    cpu = load_config("configs/smollm2-arith-cpu.yaml", ["model.path="])
    small = estimate(cpu, SMOLLM2, PARAMETERS, cuda=False)
    assert small.kv_per_replica < GIB // 4 and small.host < 8 * GIB
    assert too_big(small, 8 * GIB, None, cpu) is None
    on_gpu = load_config("configs/smollm2-arith.yaml", ["model.path="])
    big = estimate(on_gpu, SMOLLM2, PARAMETERS, cuda=True)
    assert too_big(big, 64 * GIB, 80 * GIB, on_gpu) is None  # 3 GiB of KV on half an H100
    assert too_big(big, 64 * GIB, 4 * GIB, on_gpu).startswith("a replica needs about ")


def test_the_start_line_names_each_part():
    est = estimate(load_config("configs/smollm2-arith-cpu.yaml", ["model.path="]), SMOLLM2, PARAMETERS, False)
    assert est.line().startswith(
        "memory estimate (host): per replica 1.18 GiB (KV cache 0.18 GiB, weights 0.50 GiB)"
    )
    assert est.line().endswith(
        f"relay slots 1.00 GiB x 2 and the trainer's publish slots 1.00 GiB: {est.host / GIB:.2f} GiB of host "
        "memory in all"
    )


def test_the_parameters_are_counted_from_the_safetensors_headers(tmp_path):
    for name, shapes in {"a.safetensors": [[3, 4], [5]], "b.safetensors": [[2, 2, 2]]}.items():
        header = {f"t{i}": {"dtype": "F32", "shape": s, "data_offsets": [0, 0]} for i, s in enumerate(shapes)}
        header["__metadata__"] = {"format": "pt"}
        raw = json.dumps(header).encode()
        (tmp_path / name).write_bytes(struct.pack("<Q", len(raw)) + raw)
    assert parameter_count(tmp_path) == 12 + 5 + 8


def test_a_model_directory_counts_what_its_tensors_hold(tiny_model_dir):
    from safetensors.torch import load_file

    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    assert parameter_count(tiny_model_dir) == sum(t.numel() for t in tensors.values()) > 0
