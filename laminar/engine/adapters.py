"""LoRA adapters applied in the engine (`trainer.lora_publish=adapters`): a version that holds only adapters names
each adapted weight's two factors, `X.lora_A.weight` [rank, in] and `X.lora_B.weight` [out, rank], B already
scaled by alpha / rank, so the bytes alone say what to serve: `X.weight` = base + B A. The engine keeps the base
of the adapted weights only (copied the first time each is adapted, from the weights it loaded whole) and writes
each sum into the parameter in place. The Hugging Face parameters of q/k/v and gate/up are views of their fused
matrices (`model.fuse`), so each sum lands in its rows of the fused weight."""

from __future__ import annotations

import json
from pathlib import Path

import torch

# an adapter version's names (the trainer writes them, `laminar.trainer.lora.adapter_weights`)
A_SUFFIX, B_SUFFIX = ".lora_A.weight", ".lora_B.weight"
PEFT_PREFIX = "base_model.model."  # the key prefix of peft's adapter files (`PeftModel.save_pretrained`)


def is_adapters(names) -> bool:
    """Whether a version's tensors are adapters alone (else it is a whole model)."""
    names = list(names)
    return bool(names) and all(n.endswith((A_SUFFIX, B_SUFFIX)) for n in names)


def factor_pairs(state: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{adapted weight's name: (A, B)}; a factor without its pair raises, naming it."""
    pairs = {}
    for name, a in state.items():
        if not name.endswith(A_SUFFIX):
            continue
        weight = name.removesuffix(A_SUFFIX) + ".weight"
        b = state.get(name.removesuffix(A_SUFFIX) + B_SUFFIX)
        if b is None:
            raise KeyError(f"adapter {name!r} has no {B_SUFFIX.lstrip('.')} beside it")
        pairs[weight] = (a, b)
    lone = sorted(
        n for n in state if n.endswith(B_SUFFIX) and n.removesuffix(B_SUFFIX) + ".weight" not in pairs
    )
    if lone:
        raise KeyError(f"adapter {lone[0]!r} has no {A_SUFFIX.lstrip('.')} beside it")
    return pairs


class AdaptedWeights:
    """The base of every weight an adapter version changed, on the engine's device. `clear` when whole weights
    load: they are the new base."""

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}

    def clear(self) -> None:
        self.base.clear()

    @torch.no_grad()
    def apply(self, params: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
        """Every adapted parameter := its base + B A (computed in fp32, written in the parameter's dtype); one
        adapted before but not in this version goes back to its base. Every pair is checked before any
        parameter is written: a version is applied whole or not at all."""
        pairs = factor_pairs(state)
        for name, (a, b) in pairs.items():
            p = params.get(name)
            if p is None:
                raise KeyError(f"adapter for {name!r}: this model has no such weight")
            if a.dim() != 2 or b.shape != (p.shape[0], a.shape[0]) or a.shape[1] != p.shape[1]:
                raise ValueError(
                    f"adapter for {name!r}: B {tuple(b.shape)} x A {tuple(a.shape)} does not make the weight's "
                    f"shape {tuple(p.shape)}"
                )
        for name in [n for n in self.base if n not in pairs]:
            params[name].copy_(self.base.pop(name))
        for name, (a, b) in pairs.items():
            p = params[name]
            base = self.base.get(name)
            if base is None:
                base = self.base[name] = p.detach().clone()
            a = a.to(p.device, torch.float32, non_blocking=True)
            b = b.to(p.device, torch.float32, non_blocking=True)
            p.copy_(torch.addmm(base.float(), b, a))


def read_peft_adapter(path: str | Path) -> dict[str, torch.Tensor]:
    """A peft adapter directory (`adapter_config.json`, `adapter_model.safetensors`; a LoRA checkpoint's `adapter/`)
    as an adapter version: the engine's names, B scaled. What a resumed run's replicas add to the base."""
    from safetensors.torch import load_file

    root = Path(path)
    config = json.loads((root / "adapter_config.json").read_text())
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(
            f"{root}: per-module ranks or alphas (rank_pattern, alpha_pattern) are not supported"
        )
    rank, alpha = config["r"], config["lora_alpha"]
    scale = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
    state = {}
    for key, t in load_file(str(root / "adapter_model.safetensors")).items():
        name = key.removeprefix(PEFT_PREFIX)
        state[name] = t * scale if name.endswith(B_SUFFIX) else t
    if not is_adapters(state):
        raise ValueError(f"{root}: expected LoRA A and B tensors only, got e.g. {sorted(state)[:3]}")
    return state
