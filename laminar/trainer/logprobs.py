"""The policy's log-probs of chosen tokens without full logits: only the response positions reach the output
layer, and they go through it in chunks of rows, so a [tokens, vocabulary] fp32 tensor never exists.

For a 152k-token vocabulary and a 32k-token micro-batch, full fp32 logits are 20 GB before the log-softmax and
its gradient double them; here the peak is one chunk (about 1 GB, `CHUNK_ELEMENTS`). The backward recomputes
each chunk's logits from the saved hidden states instead of keeping them, the usual trade of a second matmul
for memory (as fused linear-cross-entropy kernels do). On CUDA in bf16 the softmax runs in two Triton passes
over the bf16 logits (`laminar.trainer.logprob_kernels`), never an fp32 copy; elsewhere in eager PyTorch, which
is also the reference the fused path is checked against (`python -m laminar.cuda_check`).

With top-k or top-p set (`PolicyLogprobs`), each chunk's softmax is taken over the engine's truncated set, on the
eager path in smaller chunks (sorting a chunk takes several copies of it); without them nothing of this runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from laminar.engine.sampler import keep_threshold

CHUNK_ELEMENTS = 1 << 28  # logits per chunk (rows x vocabulary): 1 GiB in fp32
CHUNK_BYTES = 1 << 30  # the fused path's chunk of bf16 logits
TRUNCATED_CHUNK_SHARE = 8  # a truncated chunk is this much smaller: sorting it takes several copies


def truncates(top_k: int, top_p: float) -> bool:
    return top_k > 0 or top_p < 1


def kept_set(scaled: torch.Tensor, targets: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """[N, V] bool: what each row's threshold `cut` keeps, and the row's target whatever its value."""
    return (scaled >= cut[:, None]).scatter_(1, targets[:, None], True)


def truncate(
    scaled: torch.Tensor, targets: torch.Tensor, top_k: int, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`scaled` [N, V] with -inf outside each row's kept set (`kept_set`), and the rows' thresholds: the engine's
    top-k then top-p cut (`keep_threshold`), taken on these logits."""
    n, dev = scaled.shape[0], scaled.device
    with torch.no_grad():
        k = torch.full((n,), top_k, dtype=torch.int64, device=dev)
        cut = keep_threshold(scaled.detach(), k, torch.full((n,), top_p, dtype=torch.float32, device=dev))
    return scaled.masked_fill(~kept_set(scaled.detach(), targets, cut), float("-inf")), cut


def fused_applies(hidden: torch.Tensor, dtype: torch.dtype) -> bool:
    from laminar.trainer import logprob_kernels

    return hidden.is_cuda and dtype in (torch.bfloat16, torch.float16) and logprob_kernels.available()


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with an fp32 result from half-precision inputs (one cuBLAS call where the build has it)."""
    try:
        return torch.mm(a, b, out_dtype=torch.float32)
    except (TypeError, RuntimeError, NotImplementedError):
        return (a @ b).float()


def _forward_by_chunks(
    ctx, hidden, weight, targets, temperature, dtype, chunk, acc, rows, cut=None
) -> torch.Tensor:
    """The forward of both paths: each chunk's logits (in `dtype`) go to `rows(logits, targets, lse, out, cut)`,
    which fills that chunk's log-sum-exp and target log-prob (and its thresholds, when truncating); what the
    backward needs is saved."""
    w = weight.to(dtype)
    out = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
    lse = torch.empty_like(out)
    for s in range(0, hidden.shape[0], chunk):
        logits = hidden[s : s + chunk].to(dtype) @ w.T
        part = slice(s, s + chunk)
        rows(logits, targets[part], lse[part], out[part], None if cut is None else cut[part])
    ctx.save_for_backward(hidden, weight, targets, lse, cut)
    ctx.temperature, ctx.dtype, ctx.chunk = temperature, dtype, chunk
    return out


class _FusedLogprob(torch.autograd.Function):
    """`_ChunkedLogprob` on CUDA in half precision: the logits of a chunk stay in `dtype`; two Triton passes do
    the softmax (fp32 arithmetic), the backward writing the logits' gradient over them."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, dtype: torch.dtype, chunk: int):  # type: ignore[override]
        from laminar.trainer.logprob_kernels import lse_and_logprob

        def rows(logits, tgt, lse, out, _cut):
            lse_and_logprob(logits, tgt, temperature, lse, out)

        return _forward_by_chunks(
            ctx, hidden, weight, targets, temperature, dtype, chunk, torch.float32, rows
        )

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        from laminar.trainer.logprob_kernels import logits_grad_

        hidden, weight, targets, lse, _ = ctx.saved_tensors
        dtype, chunk = ctx.dtype, ctx.chunk
        w = weight.to(dtype)
        grad_out = grad_out.float().contiguous()
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk].to(dtype)
            d = logits_grad_(
                h @ w.T, targets[s : s + chunk], lse[s : s + chunk], grad_out[s : s + chunk], ctx.temperature
            )
            if grad_h is not None:
                grad_h[s : s + chunk] = (d @ w).to(hidden.dtype)
            part = _mm_fp32(d.T, h)
            grad_w = part if grad_w is None else grad_w.add_(part)
        if grad_w is None:
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        return grad_h, grad_w.to(weight.dtype), None, None, None, None


class _ChunkedLogprob(torch.autograd.Function):
    """log softmax(h W^T / T)[target] per row; W is [vocab, hidden]. Matmuls run in `dtype`, the softmax in fp32.
    With `top_k`/`top_p` the softmax is over each row's kept set (`truncate`): the backward finds the same set
    again from the recomputed logits and the thresholds the forward saved."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, hidden, weight, targets, temperature: float, dtype: torch.dtype, chunk: int, top_k=0, top_p=1.0
    ):
        acc = torch.promote_types(dtype, torch.float32)  # the softmax's precision: fp32, or fp64 if asked
        cut = None
        if truncates(top_k, top_p):
            cut = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)

        def rows(logits, tgt, lse, out, cut):
            logits = logits.to(acc) / temperature
            if cut is not None:
                logits, cut[:] = truncate(logits, tgt, top_k, top_p)
            lse[:] = torch.logsumexp(logits, dim=-1)
            out[:] = logits.gather(1, tgt[:, None]).squeeze(1) - lse

        return _forward_by_chunks(ctx, hidden, weight, targets, temperature, dtype, chunk, acc, rows, cut)

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        hidden, weight, targets, lse, cut = ctx.saved_tensors
        t, dtype, chunk, acc = ctx.temperature, ctx.dtype, ctx.chunk, lse.dtype
        w = weight.to(dtype)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk].to(dtype)
            g = grad_out[s : s + chunk].to(acc)
            logits = (h @ w.T).to(acc) / t
            # d logp[target] / d logits = onehot(target) - softmax, times the incoming gradient, over T
            d = torch.exp(logits - lse[s : s + chunk, None])
            if cut is not None:  # the softmax is zero outside the kept set
                d.masked_fill_(~kept_set(logits, targets[s : s + chunk], cut[s : s + chunk]), 0.0)
            d.mul_(-g[:, None]).scatter_add_(1, targets[s : s + chunk, None], g[:, None])
            d = d.div_(t).to(dtype)
            if grad_h is not None:
                grad_h[s : s + chunk] = (d @ w).to(hidden.dtype)
            grad_w += (d.T @ h).to(acc)
        return grad_h, grad_w.to(weight.dtype), None, None, None, None, None, None


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    dtype: torch.dtype | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """[N] log-probs (fp32; fp64 for fp64 inputs) of `targets` [N] given `hidden` [N, H] and the output layer's `weight` [V, H]."""
    dtype = dtype or hidden.dtype
    if truncates(top_k, top_p):
        chunk = max(1, CHUNK_ELEMENTS // TRUNCATED_CHUNK_SHARE // weight.shape[0])
        return _ChunkedLogprob.apply(hidden, weight, targets, float(temperature), dtype, chunk, top_k, top_p)
    if fused_applies(hidden, dtype):
        chunk = max(1, CHUNK_BYTES // (weight.shape[0] * torch.finfo(dtype).bits // 8))
        return _FusedLogprob.apply(hidden, weight, targets.contiguous(), float(temperature), dtype, chunk)
    chunk = max(1, CHUNK_ELEMENTS // weight.shape[0])
    return _ChunkedLogprob.apply(hidden, weight, targets, float(temperature), dtype, chunk)


def plain_output_layer(model: nn.Module) -> bool:
    """True when logits are exactly hidden @ W^T (no bias, soft-capping or scaling), so the chunked path applies."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head = model.get_output_embeddings()
    return (
        isinstance(head, nn.Linear)
        and head.bias is None
        and not getattr(cfg, "final_logit_softcapping", None)
        and getattr(cfg, "logit_scale", None) in (None, 1, 1.0)
    )


class PolicyLogprobs(nn.Module):
    """Wraps a Hugging Face causal LM: `forward(ids, attn, positions, targets)` gives the log-prob of each target
    token at the flat positions `positions` of the [B, L] batch (the prediction made at position p is for token
    p + 1). One module, so that a sharded (FSDP) trainer wraps it whole and every weight it reads is gathered.

    The log-prob is of the distribution the engine samples: softmax(z), z = logits / T, and with `top_k` > 0 or
    `top_p` < 1 that softmax renormalised over a kept set. The kept set is the engine's cut
    (`laminar.engine.sampler.keep_threshold`: top-k, then top-p of what remains, ties at the cut kept) taken on
    the trainer's own z, plus the target token. A sampled target is in that cut whenever the trainer's logits
    are the engine's; where numerical differences leave it just outside, it is added rather than given log 0,
    so its log-prob is z_target - log(exp(z_target) + sum of exp(z) over the cut), always finite. The cut is
    held fixed in the gradient, which flows through the kept logits only."""

    def __init__(
        self, model: nn.Module, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
    ) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature
        self.top_k, self.top_p = top_k, top_p
        self.chunked = plain_output_layer(model)

    def forward(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor | None,
        positions: torch.Tensor,
        targets: torch.Tensor,
        **packed: Any,
    ) -> torch.Tensor:
        """`packed`: a packed row's `position_ids` and cumulative lengths (see `laminar.trainer.packing`)."""
        if not self.chunked:  # an output layer with extras: full logits, then the chosen rows
            out = self.model(input_ids=ids, attention_mask=attn, use_cache=False, **packed)
            scaled = out.logits.flatten(0, 1)[positions].float() / self.temperature
            if truncates(self.top_k, self.top_p):
                scaled, _ = truncate(scaled, targets, self.top_k, self.top_p)
            logp = torch.log_softmax(scaled, dim=-1)
            return logp.gather(1, targets[:, None]).squeeze(1)
        decoder = self.model.get_decoder()
        hidden = decoder(input_ids=ids, attention_mask=attn, use_cache=False, **packed).last_hidden_state
        hidden = hidden.flatten(0, 1).index_select(0, positions)
        weight = self.model.get_output_embeddings().weight
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else hidden.dtype
        return chunked_logprobs(hidden, weight, targets, self.temperature, dtype, self.top_k, self.top_p)
