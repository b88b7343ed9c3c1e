"""The engine's two small configs: what the network looks like, and how one request samples."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Hugging Face architecture name -> (bias on q/k/v, bias on o, RMSNorm on q and k per head).
# Llama and Qwen3 put a bias on all four projections when `attention_bias` is set; Qwen2 always biases q/k/v only.
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


@dataclass
class ModelConfig:
    """The Llama-family shape the engine implements (Llama, Qwen2, Qwen3), read from a Hugging Face config."""

    family: str  # "llama" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_parameters: dict[str, Any] = field(
        default_factory=lambda: {"rope_type": "default", "rope_theta": 1e4}
    )
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in MODEL_TYPES.values():
            raise ValueError(
                f"ModelConfig.family={self.family!r}; expected one of {sorted(set(MODEL_TYPES.values()))}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads} (grouped-query "
                "attention needs whole groups)"
            )

    @classmethod
    def from_hf(cls, hf: Any) -> ModelConfig:
        """From a transformers config object or its dict (config.json), old (`rope_scaling`) or new style."""
        d = dict(hf) if isinstance(hf, dict) else hf.to_dict()
        archs = d.get("architectures") or []
        family = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
        family = family or MODEL_TYPES.get(d.get("model_type", ""))
        if family is None:
            raise ValueError(
                f"unknown architecture {archs or d.get('model_type')!r}: the engine implements "
                f"{sorted(ARCHITECTURES)} (model_type {sorted(MODEL_TYPES)})"
            )
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act={act!r} is not supported; the Llama family uses 'silu'")
        if d.get("use_sliding_window"):
            raise ValueError("use_sliding_window=True is not supported; set it to False (full attention)")
        heads = d["num_attention_heads"]
        bias = bool(d.get("attention_bias", False))
        return cls(
            family=family,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_parameters=_rope_parameters(d),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            qkv_bias=True if family == "qwen2" else bias,
            o_bias=False if family == "qwen2" else bias,
            qk_norm=family == "qwen3",
            mlp_bias=bool(d.get("mlp_bias", False)),
            eos_token_ids=eos_ids(d.get("eos_token_id")),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        """config.json; its end tokens joined by generation_config.json's (chat models declare their
        end-of-turn token there, e.g. a list of ids)."""
        file = Path(path) / "config.json"
        if not file.is_file():
            raise FileNotFoundError(
                f"{file} not found: a model directory needs config.json plus *.safetensors"
            )
        cfg = cls.from_hf(json.loads(file.read_text()))
        gen = Path(path) / "generation_config.json"
        if gen.is_file():
            more = eos_ids(json.loads(gen.read_text()).get("eos_token_id"))
            cfg.eos_token_ids = tuple(dict.fromkeys([*cfg.eos_token_ids, *more]))
        return cfg


def eos_ids(value: Any) -> tuple[int, ...]:
    """`eos_token_id` as config files write it: an int, a list of ints, or absent."""
    if value is None:
        return ()
    return (int(value),) if isinstance(value, int) else tuple(int(v) for v in value)


def _rope_parameters(d: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 writes `rope_parameters` (theta inside); older configs write `rope_theta` + `rope_scaling`."""
    params = dict(d.get("rope_parameters") or d.get("rope_scaling") or {})
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", d.get("rope_theta", 10000.0))
    return params


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples; `seed` fixes its random stream wherever it runs."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int = 0
    park_token_ids: tuple[int, ...] = ()  # sampled: the request parks (keeps its cache) instead of finishing

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}; expected >= 0 (0 means greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}; expected 0 < top_p <= 1")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k}; expected >= 0 (0 means off)")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}; expected >= 1")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "park_token_ids", tuple(self.park_token_ids))


SPECULATION_MODES = ("off", "auto", "on")


@dataclass(frozen=True)
class Speculation:
    """Grouped speculative decoding (`drafter.py`): each decode step may verify draft tokens taken from the
    request's group's text. `on`: every request drafts whenever its group's text has a match; `auto`: only while
    the running batch is at most `max_batch`, for groups whose drafts are accepted at least `min_acceptance` of
    the time, and in steps where the gate (`gate.py`) finds verifying faster a token than plain decoding, as
    measured on this engine per batch size (before it has measured, by the acceptance against `cost_ratio`).
    What a request samples is the same either way; only the number of steps changes."""

    mode: str = "off"
    max_draft: int = 8  # most draft tokens a request verifies in one step
    max_batch: int = 16  # auto: running requests at most
    min_acceptance: float = 0.5  # auto: a group's running rate of accepted draft tokens at least
    cost_ratio: float = (
        2.0  # auto: a verify step's time in plain decode steps, until the gate has measured both
    )

    def __post_init__(self) -> None:
        if self.mode not in SPECULATION_MODES:
            raise ValueError(
                f"speculation mode {self.mode!r}; expected one of {', '.join(SPECULATION_MODES)}"
            )
        if self.max_draft < 1:
            raise ValueError(f"speculation max_draft={self.max_draft}; expected >= 1")
        if self.max_batch < 1:
            raise ValueError(f"speculation max_batch={self.max_batch}; expected >= 1")
        if not 0 <= self.min_acceptance <= 1:
            raise ValueError(f"speculation min_acceptance={self.min_acceptance}; expected in [0, 1]")
        if not self.cost_ratio > 0:
            raise ValueError(f"speculation cost_ratio={self.cost_ratio}; expected > 0")
