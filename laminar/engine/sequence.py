"""One request's state inside an engine, and the small records that leave it."""

from __future__ import annotations

from dataclasses import dataclass, field

from laminar.engine.config import SamplingParams


@dataclass
class Sequence:
    """Prompt plus generated tokens; `num_cached` of them have keys/values in the blocks of `block_table`."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)  # weight version that sampled each output token
    block_table: list[int] = field(default_factory=list)
    num_cached: int = 0
    num_prefilled: int = 0  # tokens recomputed by re-prefill (preemption or import), for accounting

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass
class ExportedRequest:
    """Everything another engine needs to continue a request exactly where it stopped (picklable, no tensors)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    logprobs: list[float]
    token_versions: list[int]
    params: SamplingParams
    version: int  # the exporting engine's weight version


@dataclass
class FinishedRequest:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS or a stop token), "length" (max_new_tokens or context), "abort"
    version: (
        int  # the version that sampled its first token (see token_versions when a request changed version)
    )
    token_versions: list[int]
    reprefill_tokens: int = 0


@dataclass
class StepOutput:
    new_tokens: dict[str, list[int]] = field(default_factory=dict)
    finished: list[FinishedRequest] = field(default_factory=list)
    is_prefill: bool = False
    num_tokens: int = 0  # tokens the model processed this step


@dataclass
class EngineStats:
    waiting: int
    running: int
    kv_blocks_used: int
    kv_blocks_total: int
    tokens_generated: int
    peak_kv_blocks: int  # since the last reset_peak()
    version: int
    num_preemptions: int = 0
    block_size: int = 16
