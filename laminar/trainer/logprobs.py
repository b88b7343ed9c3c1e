"""The policy's log-probs of chosen tokens without full logits: only the response positions reach the output
layer, and they go through it in chunks of rows, so a [tokens, vocabulary] fp32 tensor never exists.

For a 152k-token vocabulary and a 32k-token micro-batch, full fp32 logits are 20 GB before the log-softmax and
its gradient double them; here the peak is one chunk (about 1 GB, `CHUNK_ELEMENTS`). The backward recomputes
each chunk's logits from the saved hidden states instead of keeping them, the usual trade of a second matmul
for memory (as fused linear-cross-entropy kernels do).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

CHUNK_ELEMENTS = 1 << 28  # logits per chunk (rows x vocabulary): 1 GiB in fp32


class _ChunkedLogprob(torch.autograd.Function):
    """log softmax(h W^T / T)[target] per row; W is [vocab, hidden]. Matmuls run in `dtype`, the softmax in fp32."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, dtype: torch.dtype, chunk: int):  # type: ignore[override]
        w = weight.to(dtype)
        acc = torch.promote_types(dtype, torch.float32)  # the softmax's precision: fp32, or fp64 if asked
        out = torch.empty(hidden.shape[0], dtype=acc, device=hidden.device)
        lse = torch.empty_like(out)
        for s in range(0, hidden.shape[0], chunk):
            logits = (hidden[s : s + chunk].to(dtype) @ w.T).to(acc) / temperature
            lse[s : s + chunk] = torch.logsumexp(logits, dim=-1)
            out[s : s + chunk] = (
                logits.gather(1, targets[s : s + chunk, None]).squeeze(1) - lse[s : s + chunk]
            )
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.dtype, ctx.chunk = temperature, dtype, chunk
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        hidden, weight, targets, lse = ctx.saved_tensors
        t, dtype, chunk, acc = ctx.temperature, ctx.dtype, ctx.chunk, lse.dtype
        w = weight.to(dtype)
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk].to(dtype)
            g = grad_out[s : s + chunk].to(acc)
            logits = (h @ w.T).to(acc) / t
            # d logp[target] / d logits = onehot(target) - softmax, times the incoming gradient, over T
            d = torch.exp(logits - lse[s : s + chunk, None]).mul_(-g[:, None])
            d.scatter_add_(1, targets[s : s + chunk, None], g[:, None])
            d = d.div_(t).to(dtype)
            if grad_h is not None:
                grad_h[s : s + chunk] = (d @ w).to(hidden.dtype)
            grad_w += (d.T @ h).to(acc)
        return grad_h, grad_w.to(weight.dtype), None, None, None, None


def chunked_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """[N] log-probs (fp32; fp64 for fp64 inputs) of `targets` [N] given `hidden` [N, H] and the output layer's `weight` [V, H]."""
    dtype = dtype or hidden.dtype
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
    p + 1). One module, so that a sharded (FSDP) trainer wraps it whole and every weight it reads is gathered."""

    def __init__(self, model: nn.Module, temperature: float = 1.0) -> None:
        super().__init__()
        self.model = model
        self.temperature = temperature
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
            logits = self.model(input_ids=ids, attention_mask=attn, **packed).logits.flatten(0, 1)[positions]
            logp = torch.log_softmax(logits.float() / self.temperature, dim=-1)
            return logp.gather(1, targets[:, None]).squeeze(1)
        hidden = self.model.get_decoder()(input_ids=ids, attention_mask=attn, **packed).last_hidden_state
        hidden = hidden.flatten(0, 1).index_select(0, positions)
        weight = self.model.get_output_embeddings().weight
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else hidden.dtype
        return chunked_logprobs(hidden, weight, targets, self.temperature, dtype)
