"""Requests that move: out of an engine and into another mid-generation (the receiver re-prefills, or takes the
keys and values over when its weights are the same), and out of the batch and back for a tool turn (parked with
their cached prefix, resumed with the tool's output as context)."""

from __future__ import annotations

from laminar.engine.sequence import ExportedRequest, FinishedRequest, MovedKV, Sequence


class RequestMoves:
    """`Engine`'s request moves (its sequences, scheduler, block manager and model runner)."""

    def export_request(self, request_id: str, with_kv: bool = False) -> ExportedRequest:
        """Remove a request and return what another engine needs to continue it; `with_kv`: with the keys and
        values it has cached, so an engine of the same weights takes them over instead of prefilling again (under
        tensor parallelism, this rank's KV heads: the same rank of an engine of the same degree takes them)."""
        seq = self._seqs.get(request_id)
        if seq is None:
            raise KeyError(
                f"request {request_id!r} is not in this engine (finished, aborted, or never added)"
            )
        kv = self.runner.read_kv(seq.block_table, seq.num_cached) if with_kv and seq.num_cached else None
        group_text = seq.group.texts(seq.stream) if seq.group is not None else []
        self.abort(request_id)
        return ExportedRequest(
            request_id=seq.request_id,
            prompt_token_ids=seq.token_ids[: seq.num_prompt_tokens],
            output_token_ids=seq.output_ids,
            logprobs=list(seq.logprobs),
            token_versions=list(seq.token_versions),
            params=seq.params,
            version=self.version,
            loss_mask=seq.mask() if seq.loss_mask else [],
            parked=seq.parked,
            kv=kv,
            group_text=group_text,
        )

    def import_request(self, exported: ExportedRequest) -> None:
        """Queue a moved request; it re-prefills prompt plus outputs, then continues its own sampling stream (and,
        speculating, drafts from the group text it brought as well as from what this engine holds). A
        request that was parked (waiting for a tool) stays parked here until `resume`. One that brings its keys
        and values (`kv`) from an engine of this version starts from them and prefills only the rest, when they
        fit this engine's cache and free blocks; otherwise it re-prefills as any other."""
        e = exported
        if len(e.logprobs) != len(e.output_token_ids):
            raise ValueError(
                f"request {e.request_id!r}: {len(e.logprobs)} log-probs for {len(e.output_token_ids)} tokens"
            )
        tokens = list(e.prompt_token_ids) + list(e.output_token_ids)
        self._check_new(e.request_id, len(tokens), "prompt plus outputs")
        if e.kv is not None and e.kv.shard != self.runner.shard:
            raise ValueError(
                f"request {e.request_id!r}: its keys and values are shard {e.kv.shard} (rank, world) but this "
                f"engine is rank {self.runner.shard[0]} of {self.runner.shard[1]}; give each rank its own rank's "
                "shard, or between degrees tensor_parallel.gather_kv then split_kv (or export without with_kv)"
            )
        versions = list(e.token_versions) or [e.version] * len(e.output_token_ids)
        seq = Sequence(
            e.request_id,
            tokens,
            len(e.prompt_token_ids),
            e.params,
            list(e.logprobs),
            versions,
            loss_mask=list(e.loss_mask),
        )
        if e.kv is not None and e.version == self.version:
            self._take_kv(seq, e.kv)
        self._admit(seq)
        if seq.group is not None:
            prompt = tokens[: seq.num_prompt_tokens]
            for text in e.group_text:
                seq.group.add_text(prompt + list(text))
        if e.parked:
            self.scheduler.park(seq)

    def _take_kv(self, seq: Sequence, kv: MovedKV) -> None:
        """Give `seq` blocks holding `kv`, if it matches this model and every block it needs is free (else it
        re-prefills). A waiting request holding blocks gives them up to one that cannot start otherwise."""
        if kv.num_tokens >= len(seq) or not self.runner.fits_kv(kv):
            return
        if not self.blocks.can_allocate(seq):
            return
        self.blocks.allocate(seq)
        self.runner.write_kv(seq.block_table, kv)
        seq.num_cached = kv.num_tokens

    def park(self, request_id: str) -> None:
        """Take a request out of the batch between steps (its model turn ended in a tool call), keeping its
        cached prefix; `resume` brings it back. Parked requests give their blocks up first when blocks run out."""
        seq = self._seqs.get(request_id)
        if seq is None:
            raise KeyError(
                f"request {request_id!r} is not in this engine (finished, aborted, or never added)"
            )
        if not seq.parked:
            self.scheduler.park(seq)

    def resume(self, request_id: str, context_ids: list[int]) -> FinishedRequest | None:
        """Append `context_ids` (a tool's output, as the chat template renders it) to a parked request and queue
        it: its next prefill covers only what it has not cached (the last sampled token and these), then it
        samples on from the same stream. The appended tokens are context: mask 0, log-prob 0.0, never trained.
        A request that no longer fits the context ends here with reason "length" (returned)."""
        seq = self._seqs.get(request_id)
        if seq is None or not seq.parked:
            raise KeyError(f"request {request_id!r} is not parked in this engine; park it before resume")
        vocab = self.config.vocab_size
        bad = [t for t in context_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(
                f"request {request_id!r}: context ids {bad[:5]} outside the vocabulary [0, {vocab})"
            )
        if len(seq) + len(context_ids) >= self.max_model_len:
            return self._finish(seq, "length")
        mask = seq.mask()
        seq.token_ids.extend(context_ids)
        seq.logprobs.extend([0.0] * len(context_ids))
        seq.token_versions.extend([self.version] * len(context_ids))
        seq.loss_mask = mask + [0] * len(context_ids)
        self.scheduler.unpark(seq)
        return None

    def loss_mask(self, request_id: str) -> list[int]:
        """Per output token so far: 1 sampled, 0 appended context."""
        return self._seqs[request_id].mask()

    def progress(self, request_id: str) -> tuple[list[int], list[float]]:
        """Output tokens and their log-probs so far (what the partial response pool keeps)."""
        seq = self._seqs[request_id]
        return seq.output_ids, list(seq.logprobs)
