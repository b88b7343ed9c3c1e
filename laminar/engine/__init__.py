"""The rollout engine: continuous batching over a paged KV cache, with requests that can move between engines.

The names below load on first use: the control plane reads `laminar.engine.config` (end tokens, sampling
settings) without importing torch, which only the replicas and the trainer need."""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOME = {
    "Engine": "engine",
    "EngineStats": "stats",
    "ExportedRequest": "sequence",
    "FinishedRequest": "sequence",
    "ModelConfig": "config",
    "SamplingParams": "config",
    "StepOutput": "sequence",
    "TPGroup": "tensor_parallel",
    "WeightLayout": "layout",
    "flatten_into": "weights",
    "flatten_state_dict": "weights",
    "unflatten": "weights",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'laminar.engine' has no attribute {name!r}")
    return getattr(import_module(f"laminar.engine.{_HOME[name]}"), name)
