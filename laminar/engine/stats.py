"""The counters an engine reports: plain data that the control plane reads in every replica snapshot, so this
module imports neither torch nor the rest of the engine."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class EngineStats:
    """An engine's counters (`Engine.stats`); a replica's snapshot (`laminar.data.records.ReplicaSnapshot`) is
    these and what only the replica knows."""

    version: int = 0  # the weights it generates with
    waiting: int = 0  # requests not yet in the batch
    running: int = 0  # requests in the batch
    parked: int = 0  # requests waiting for a tool call: out of the batch, still this engine's work
    kv_blocks_used: int = 0  # KV blocks held now, of `kv_blocks_total`
    kv_blocks_total: int = 0
    # the most held since the last `reset_peak()` (a replica's: since its batch began)
    peak_kv_blocks: int = 0
    tokens_generated: int = 0
    num_preemptions: int = 0
    block_size: int = 16
    prefill_tokens: int = 0  # tokens run through prefill, all told
    shared_prompt_tokens: int = 0  # prompt tokens a request took from its group's first instead of prefilling
    decode_steps: int = 0
    queued_ahead: int = 0  # decode steps queued before the previous one's tokens were known (pipelined)
    dropped_rows: int = 0  # rows of such steps whose request stopped, parked, left or was aborted meanwhile
    # speculation: decode steps that verified drafts; requests (rows) in them that had one; the draft tokens
    # they verified and accepted; the tokens those rows emitted (accepted plus one sampled, less any past an end);
    # host seconds spent drafting (the index, the proposals, auto's guesses)
    verify_steps: int = 0
    draft_rows: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_tokens: int = 0
    draft_s: float = 0.0
    # auto's gate (`engine/gate.py`): decode steps by the decision they ran under, and its measured milliseconds
    # an emitted token of each path ("plain", "verify") by running-batch range ("1", "2-3", "4-7", ...)
    gate_steps: dict[str, int] = field(default_factory=dict)
    gate_ms_per_token: dict[str, dict[str, float | None]] = field(default_factory=dict)
