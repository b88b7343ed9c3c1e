"""The output layer's softmax in two Triton passes over bf16 logits, for `laminar.trainer.logprobs` on CUDA.

The eager path casts each chunk of logits to fp32 and walks it with a chain of elementwise kernels (scale,
log-sum-exp, gather; in the backward: scale, subtract, exp, multiply, scatter, divide, cast), each a pass over
[rows, vocabulary] in memory: for a 0.5B model, whose output layer is a quarter of its parameters, those passes
cost more than the output layer's matrix products. Here the forward reads each row of bf16 logits once (an
online log-sum-exp, and the target's logit), and the backward reads it once and writes the gradient of the
logits in its place, in bf16. The arithmetic is fp32 throughout. Imported lazily: CPU machines need no Triton.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only install
    triton = None

BLOCK = 4096  # vocabulary entries a program reads at a time


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _lse_kernel(logits, stride, targets, lse_out, logp_out, vocab, inv_t, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits + row * stride
        cols = tl.arange(0, BLOCK)
        m = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: running max and sum of exp(x - max)
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, vocab, BLOCK):
            x = tl.load(base + start + cols, mask=start + cols < vocab, other=float("-inf")).to(tl.float32)
            x = x * inv_t
            m_new = tl.maximum(m, x)
            # lanes that have seen nothing yet stay at (-inf, 0); exp(-inf - -inf) would be nan
            s = tl.where(m_new == float("-inf"), 0.0, s * tl.exp(m - m_new) + tl.exp(x - m_new))
            m = m_new
        top = tl.max(m, 0)
        total = tl.sum(tl.where(m == float("-inf"), 0.0, s * tl.exp(m - top)), 0)
        lse = top + tl.log(total)
        target = tl.load(targets + row)
        x_t = tl.load(base + target).to(tl.float32) * inv_t
        tl.store(lse_out + row, lse)
        tl.store(logp_out + row, x_t - lse)

    @triton.jit
    def _grad_kernel(logits, stride, targets, lse_in, grad_in, vocab, inv_t, BLOCK: tl.constexpr):
        """d logp[target] / d logits = (onehot(target) - softmax) / T, times the incoming gradient; written
        over the logits, row by row."""
        row = tl.program_id(0).to(tl.int64)
        base = logits + row * stride
        cols = tl.arange(0, BLOCK)
        lse = tl.load(lse_in + row)
        g = tl.load(grad_in + row).to(tl.float32)
        target = tl.load(targets + row)
        for start in range(0, vocab, BLOCK):
            idx = start + cols
            keep = idx < vocab
            x = tl.load(base + idx, mask=keep, other=0.0).to(tl.float32) * inv_t
            d = -g * tl.exp(x - lse)
            d = tl.where(idx == target, d + g, d) * inv_t
            tl.store(base + idx, d.to(logits.dtype.element_ty), mask=keep)


def lse_and_logprob(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, lse: torch.Tensor, logp: torch.Tensor
) -> None:
    """Write the log-sum-exp and the target's log-prob of each row of `logits` / T (fp32) into `lse` and `logp`
    (contiguous, one entry a row); `logits` [rows, vocab], rows contiguous."""
    rows, vocab = logits.shape
    if rows:
        _lse_kernel[(rows,)](
            logits, logits.stride(0), targets, lse, logp, vocab, 1.0 / temperature, BLOCK=BLOCK, num_warps=8
        )


def logits_grad_(
    logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Overwrite `logits` with the gradient of the rows' target log-probs (each scaled by `grad`) w.r.t. them."""
    rows, vocab = logits.shape
    if rows:
        _grad_kernel[(rows,)](
            logits, logits.stride(0), targets, lse, grad, vocab, 1.0 / temperature, BLOCK=BLOCK, num_warps=8
        )
    return logits
