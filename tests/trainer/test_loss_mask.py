"""A tool's output inside a response is context: it never reaches the loss, the advantages' token count or the
train/rollout mismatch, whatever log-probs it carries."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from laminar.trainer.trainer import Trainer
from tests.trainer.test_sharded import CFG, batch, model


def with_tool_output(groups, logprob: float):
    """Every response gets 4 tokens of 'tool output' in its middle, mask 0, with the given log-prob."""
    out = copy.deepcopy(groups)
    for g in out:
        for t in g:
            cut = len(t.response_ids) // 2
            t.response_ids = t.response_ids[:cut] + [5, 6, 7, 8] + t.response_ids[cut:]
            t.logprobs = t.logprobs[:cut] + [logprob] * 4 + t.logprobs[cut:]
            t.loss_mask = [1] * cut + [0] * 4 + [1] * (len(t.response_ids) - cut - 4)
    return out


def step(groups, packing: str) -> tuple[dict, dict[str, torch.Tensor]]:
    tr = Trainer(replace(CFG, packing=packing), model=model())
    m = tr.train_step(groups)
    return m, {k: v.clone() for k, v in tr.model.state_dict().items()}


@pytest.mark.parametrize("packing", ["off", "on"])
def test_tool_tokens_never_reach_the_loss(packing):
    groups = batch()
    m0, w0 = step(with_tool_output(groups, 0.0), packing)
    m1, w1 = step(with_tool_output(groups, -30.0), packing)  # the context's log-probs are ignored
    for k in w0:
        assert torch.equal(w0[k], w1[k]), k
    assert m0["loss"] == m1["loss"] and m0["logprob_mismatch_abs"] == m1["logprob_mismatch_abs"]
    model_tokens = sum(len(t.response_ids) for g in groups for t in g)
    assert m0["response_tokens"] == model_tokens + 4 * sum(len(g) for g in groups)

    trained = with_tool_output(groups, -30.0)  # the same tokens, trained: now they count
    for g in trained:
        for t in g:
            t.loss_mask = []
    m2, w2 = step(trained, packing)
    assert any(not torch.equal(w0[k], w2[k]) for k in w0)
    assert m2["logprob_mismatch_abs"] > m0["logprob_mismatch_abs"]


def test_a_mask_of_the_wrong_length_is_refused():
    groups = with_tool_output(batch(), 0.0)
    groups[0][0].loss_mask = [1]
    with pytest.raises(ValueError, match="loss mask of 1"):
        Trainer(CFG, model=model()).train_step(groups)
