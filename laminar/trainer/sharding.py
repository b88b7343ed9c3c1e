"""How the trainer's model is laid out: FSDP2 over the ranks, fp32 master weights with a bf16 compute copy on a
single trainer, and regionally compiled decoder layers."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from laminar.trainer.logprobs import PolicyLogprobs


class MasterWeights:
    """Mixed precision for one trainer: `compute`, a copy of the fp32 `master` model in `dtype` that runs the
    forward and backward, and the master that the optimizer updates. As the backward finishes each gradient of
    the copy, a hook adds it into the master parameter's fp32 gradient and frees it, so micro-batches
    accumulate in fp32 and the copy holds no gradients between them. `refresh` casts the master into the copy
    after every update. Tied parameters stay tied: the copy is a deep copy, one tensor where the master has one."""

    def __init__(self, master: nn.Module, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.compute = copy.deepcopy(master).to(dtype)
        # the trained parameters (LoRA: the adapters; the frozen base is cast once, here)
        pairs = zip(master.parameters(), self.compute.parameters())
        self.pairs = [(m, c) for m, c in pairs if m.requires_grad]
        for m, c in self.pairs:
            if m.shape != c.shape:
                raise RuntimeError("the compute copy's parameters do not line up with the master's")
            c.register_post_accumulate_grad_hook(self._accumulate(m))

    @staticmethod
    def _accumulate(m: torch.Tensor):
        def hook(c: torch.Tensor) -> None:
            if m.grad is None:
                m.grad = c.grad.to(m.dtype)
            else:
                m.grad.add_(c.grad)
            c.grad = None

        return hook

    @torch.no_grad()
    def refresh(self) -> None:
        torch._foreach_copy_([c for _, c in self.pairs], [m for m, _ in self.pairs])


def compile_layers(model: PreTrainedModel) -> None:
    """Regional compilation: each decoder layer's forward through torch.compile, in place (the module and its
    parameter names stay as they are, so sharding, checkpoints and the publish see the same model). Norms,
    rotary embeddings, activations and casts fuse into a few kernels around the matrix products and the
    attention; the layers share one compiled graph with dynamic shapes (packed micro-batches change length every
    step). The policy's forward passes `use_cache=False`: a KV cache object in the layer's arguments changes
    the graph's guards layer by layer, and the recompile limit then leaves every layer eager."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ValueError(
            f"trainer.compile: {type(model).__name__} has no decoder layers at model.get_decoder().layers; "
            "set trainer.compile=false"
        )
    for layer in layers:
        layer.compile(dynamic=True)


def clip_grad_norm(parameters: Any, max_norm: float) -> float:
    """Clip the gradients to `max_norm` and return their norm before, as a float: sharded (DTensor) parameters'
    norm is already reduced over the ranks."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def shard_policy(
    policy: PolicyLogprobs, device: torch.device, cpu_offload: bool, reshard_after_forward: bool = True
) -> None:
    """FSDP2: each decoder layer its own unit, then the whole policy (embeddings, final norm, output layer)."""
    shard(policy, policy.model.get_decoder(), device, cpu_offload, reshard_after_forward)


def shard(
    root: nn.Module,
    decoder: nn.Module,
    device: torch.device,
    cpu_offload: bool,
    reshard_after_forward: bool = True,
) -> None:
    """FSDP2 over `root` (the policy, or the critic's value model): each of `decoder`'s layers its own unit,
    then `root` with the rest. On CUDA: bf16 compute from fp32 master weights, gradients reduced in fp32."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kw: dict[str, Any] = {}
    if device.type == "cuda":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cpu_offload:
        kw["offload_policy"] = CPUOffloadPolicy()
    if device.type == "cuda" and not cpu_offload:
        root.to(device)
    layers = getattr(decoder, "layers", None)
    for layer in layers if layers is not None else []:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **kw)
    fully_shard(root, **kw)
