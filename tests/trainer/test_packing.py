"""Packed micro-batches (one row of sequences, no padding) give the padded path's log-probs and gradients."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from laminar.trainer.packing import _per_sequence, packed_attention
from laminar.trainer.trainer import Trainer
from tests.trainer.test_sharded import CFG, batch, model


def trainers():
    return Trainer(replace(CFG, packing="off"), model=model()), Trainer(
        replace(CFG, packing="on"), model=model()
    )


def test_packed_log_probs_and_gradients_equal_the_padded_ones():
    padded, packed = trainers()
    assert packed.packed and not padded.packed
    trajs = [t for g in batch() for t in g]
    for tr in (padded, packed):
        b = tr._collate(trajs, [1.0] * len(trajs))
        logp = tr._forward_logprobs(tr.policy, b)
        (logp * torch.linspace(-1, 1, len(logp))).sum().backward()
    a, b = padded._collate(trajs), packed._collate(trajs)
    assert b["ids"].shape == (1, sum(t.num_tokens for t in trajs))  # no padding at all
    assert a["ids"].numel() > b["ids"].numel()
    lp_a = padded._forward_logprobs(padded.policy, a)
    lp_b = packed._forward_logprobs(packed.policy, b)
    assert float((lp_a - lp_b).detach().abs().max()) < 1e-5
    for (name, p), q in zip(padded.model.named_parameters(), packed.model.parameters()):
        assert float((p.grad - q.grad).abs().max()) < 1e-5, name


def test_packed_micro_batches_are_filled_by_real_tokens():
    tr = Trainer(replace(CFG, packing="on", micro_batch_tokens=40), model=model())
    lengths = [30, 5, 5, 5, 20, 12]
    cuts = tr.micro_batches(lengths, list(range(6)))
    assert sorted(i for c in cuts for i in c) == list(range(6))
    assert all(sum(lengths[i] for i in c) <= 40 or len(c) == 1 for c in cuts)
    assert len(cuts) == 3  # [30, 5, 5], [20, 12, 5], the padded path would need 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="variable-length flash attention needs CUDA")
def test_flash_varlen_attention_matches_per_sequence_attention():
    torch.manual_seed(0)
    lens = [7, 130, 1, 64, 300]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(1, 8, sum(lens), 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 2, sum(lens), 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 2, sum(lens), 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, _ = packed_attention(None, q, k, v, None, scaling=0.125, cu_seq_lens_q=cu, max_length_q=max(lens))
    out.float().square().sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    qq, kk, vv = (x[0].transpose(0, 1).float() for x in (q, k, v))
    kk, vv = kk.repeat_interleave(4, dim=1), vv.repeat_interleave(4, dim=1)
    ref = _per_sequence(qq, kk, vv, cu, 0.125)
    ref.square().sum().backward()
    assert float((out[0].float() - ref).abs().max()) < 3e-2
    for g, x in zip(grads, (q, k, v)):
        assert float((g.float() - x.grad.float()).abs().max()) < 0.1 * float(x.grad.float().abs().max())
