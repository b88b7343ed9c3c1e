"""LoRA through `peft`: low-rank adapters on the policy's projections, the base weights frozen. A publish is, by
`trainer.lora_publish`, the merged model, W + B A x alpha / rank, in the base model's layout (the replicas load
it as any model), or the adapters alone, A and B x alpha / rank for each adapted weight (`adapter_weights`),
which each replica adds to the base it loaded from `model.path` (`laminar.engine.adapters`): rank x (in + out)
numbers a projection instead of in x out. Either way a checkpoint's model files hold the merged model (what
`laminar export` writes) and `adapter/` the adapters alone (the format `peft.PeftModel.from_pretrained` reads;
what a resumed run's replicas add to the base with `adapters`), with their optimizer state; the base is loaded
again from `model.path`."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from laminar.engine.adapters import A_SUFFIX, B_SUFFIX, PEFT_PREFIX

ADAPTER = "default"  # peft's name for the one adapter
ADAPTER_DIR = "adapter"
ADAPTER_FILE = "adapter_model.safetensors"


def add_adapters(model: nn.Module, rank: int, alpha: float, targets: list[str], base_path: str = "") -> None:
    """Adapters of `rank` on the modules named `targets` (or `["all-linear"]`), in place; every other parameter
    frozen. B starts at zero, so the model computes what it did."""
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules="all-linear" if list(targets) == ["all-linear"] else list(targets),
        base_model_name_or_path=base_path or None,
        task_type="CAUSAL_LM",
    )
    try:
        inject_adapter_in_model(config, model, adapter_name=ADAPTER)
    except ValueError as e:  # peft: none of the targets is in the model
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ValueError(
            f"trainer.lora_target_modules={list(targets)}: not modules of {type(model).__name__} ({e}); its "
            f"linear layers are named {names}"
        ) from e


def base_name(key: str) -> str | None:
    """A state_dict key of the adapted model as the base model names it; None for an adapter's own tensor."""
    return None if ".lora_" in key else key.replace(".base_layer.", ".")


def adapter_key(name: str) -> str:
    """A trainer's adapter parameter by the key peft's adapter files give it."""
    return PEFT_PREFIX + name.replace(f".{ADAPTER}.", ".")


def adapter_param(key: str) -> str:
    """`adapter_key` undone: `base_model.model.X.lora_A.weight` -> `X.lora_A.default.weight`."""
    name = key.removeprefix(PEFT_PREFIX)
    head, _, leaf = name.rpartition(".")
    return f"{head}.{ADAPTER}.{leaf}"


@torch.no_grad()
def merged_weights(
    model: nn.Module,
    names: list[str],
    out: dict[str, torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """The weights `names` (base names) with every adapter merged in: W + B A x scale, computed in the
    parameters' precision and written in `dtype`. Adapted weights go into `out`'s buffers where it has them
    (kept between publishes: no fresh allocation of the model's size each time); the rest are the base
    parameters themselves, or cast copies in `dtype`."""
    out = {} if out is None else out
    layers = {f"{n}.weight": m for n, m in model.named_modules() if hasattr(m, "get_delta_weight")}
    state = {base_name(k): v for k, v in model.state_dict().items() if base_name(k) is not None}
    merged = {}
    for name in names:
        weight = state[name].detach()
        want = dtype or weight.dtype
        layer = layers.get(name)
        if layer is None:
            merged[name] = weight.to(want)
            continue
        buf = out.get(name)
        if buf is None or buf.dtype != want:
            buf = out[name] = torch.empty(weight.shape, dtype=want, device=weight.device)
        torch.add(weight, layer.get_delta_weight(ADAPTER), out=buf)
        merged[name] = buf
    return merged


@torch.no_grad()
def adapter_weights(
    model: nn.Module, out: dict[str, torch.Tensor] | None = None, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The adapters as the engine adds them (`laminar.engine.adapters`): `X.lora_A.weight` and `X.lora_B.weight` x
    peft's scale (alpha / rank) for each adapted weight `X.weight`, in `dtype`. A is the parameter itself (or
    its cast copy); the scaled Bs go into `out`'s buffers, kept between publishes."""
    out = {} if out is None else out
    weights = {}
    for name, m in adapted_modules(model).items():
        a, b = m.lora_A[ADAPTER].weight.detach(), m.lora_B[ADAPTER].weight.detach()
        want = dtype or b.dtype
        weights[name + A_SUFFIX] = a.to(want)
        key = name + B_SUFFIX
        buf = out.get(key)
        if buf is None or buf.dtype != want:
            buf = out[key] = torch.empty(b.shape, dtype=want, device=b.device)
        torch.mul(b, m.scaling[ADAPTER], out=buf)
        weights[key] = buf
    return weights


def adapted_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The modules peft adapted, by their base names; an adapter the engine could not add to a linear weight
    (peft's embedding or convolution adapters) raises, naming it."""
    layers = {n: m for n, m in model.named_modules() if hasattr(m, "get_delta_weight")}
    for name, m in layers.items():
        if ADAPTER not in getattr(m, "lora_A", {}) or not isinstance(m.get_base_layer(), nn.Linear):
            raise ValueError(
                f"trainer.lora_publish=adapters: {name} ({type(m.get_base_layer()).__name__}) is not a linear "
                "layer, whose adapters the engine adds; adapt linear layers only, or publish merged"
            )
    return layers


def save_adapter(model: nn.Module, out: Path) -> None:
    """The adapters as `peft` saves them: `adapter_model.safetensors` and `adapter_config.json`."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        adapter_key(n): p.detach().cpu().contiguous() for n, p in model.named_parameters() if ".lora_" in n
    }
    save_file(tensors, str(out / ADAPTER_FILE), metadata={"format": "pt"})
    model.peft_config[ADAPTER].save_pretrained(str(out))
