"""The rollout engine: continuous batching over a paged KV cache, with requests that can move between engines."""

from laminar.engine.config import ModelConfig, SamplingParams
from laminar.engine.engine import Engine
from laminar.engine.sequence import EngineStats, ExportedRequest, FinishedRequest, StepOutput
from laminar.engine.weights import WeightLayout, flatten_into, flatten_state_dict, unflatten

__all__ = [
    "Engine",
    "EngineStats",
    "ExportedRequest",
    "FinishedRequest",
    "ModelConfig",
    "SamplingParams",
    "StepOutput",
    "WeightLayout",
    "flatten_into",
    "flatten_state_dict",
    "unflatten",
]
