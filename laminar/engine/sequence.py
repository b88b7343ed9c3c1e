"""One request's state inside an engine, and the small records that leave it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from laminar.engine.config import SamplingParams
from laminar.engine.drafter import GroupText


@dataclass(eq=False)  # a request is itself: queues find it by identity, never by comparing its tokens
class Sequence:
    """Prompt plus generated tokens; `num_cached` of them have keys/values in the blocks of `block_table`."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)  # weight version that sampled each output token
    # per output token: 1 sampled by the model, 0 appended as context (a tool's output; its log-prob is 0.0
    # and it is never trained on). Empty means all 1 (a request that never resumed with context).
    loss_mask: list[int] = field(default_factory=list)
    block_table: list[int] = field(default_factory=list)
    num_cached: int = 0
    num_prefilled: int = 0  # tokens recomputed by re-prefill (preemption or import), for accounting
    parked: bool = False  # waiting outside the batch (for a tool), its cached prefix kept while blocks allow
    # the first request with the same prompt: once it has computed the prompt, this one starts from its full
    # blocks and prefills only the rest (one prefill per group); None = prefill alone
    share_from: Sequence | None = None
    # set by the engine on admission, so a decode step checks each row with one set lookup and one comparison:
    # the tokens that end or park it, and the length at which it ends (0: check every step in full)
    watch_tokens: frozenset[int] = frozenset()
    limit: int = 0
    # speculation (`drafter.py`): the group whose text it drafts from, its stream there, its next draft length
    group: GroupText | None = None
    stream: int = 0
    draft_len: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def mask(self) -> list[int]:
        """`loss_mask` filled out to every output token."""
        return self.loss_mask + [1] * (self.num_output - len(self.loss_mask))


@dataclass
class MovedKV:
    """The keys and values a request had cached, for an engine of the same model and weights to take over
    instead of prefilling them again: [layers, tokens, kv_heads, head_dim] each, as raw bytes of `dtype`. From a
    tensor-parallel engine, one rank's KV heads only (`tensor_parallel.py`)."""

    num_tokens: int
    shape: tuple[int, int, int, int]
    dtype: str  # torch dtype name, e.g. "bfloat16"
    keys: np.ndarray  # uint8
    values: np.ndarray  # uint8
    shard: tuple[int, int] = (0, 1)  # (rank, world) of the engine that exported it; (0, 1): every KV head


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
    loss_mask: list[int] = field(default_factory=list)  # per output token (see Sequence); [] = all sampled
    parked: bool = False  # it was waiting for a tool: the importer keeps it parked until `resume`
    kv: MovedKV | None = None  # its cached keys and values (`export_request(with_kv=True)`); None: re-prefill
    # the outputs of its group's other samples that the exporter held (speculating engines only; see drafter.py):
    # a speculating importer drafts from them
    group_text: list[list[int]] = field(default_factory=list)


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
    loss_mask: list[int] = field(default_factory=list)  # per output token (see Sequence); [] = all sampled


@dataclass
class StepOutput:
    new_tokens: dict[str, list[int]] = field(default_factory=dict)
    finished: list[FinishedRequest] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)  # requests that sampled a park token (a tool call's end)
    is_prefill: bool = False
    num_tokens: int = 0  # tokens the model processed this step
