"""Greedy tokens and per-token log-probs equal Hugging Face transformers on the same random weights."""

import pytest
import torch

from laminar.engine import SamplingParams

from .helpers import engine_for, hf_model

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 60)), [3]]
NEW = 24


def run_all(engine, prompts, params):
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params)
    done = {}
    while engine.has_unfinished():
        for f in engine.step().finished:
            done[f.request_id] = f
    return [done[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("family,tied", [("llama", True), ("qwen2", True), ("qwen3", True), ("qwen2", False)])
def test_greedy_matches_transformers(family, tied):
    model = hf_model(family, tied)
    outs = run_all(
        engine_for(model), PROMPTS, SamplingParams(temperature=0, max_new_tokens=NEW, ignore_eos=True)
    )
    for p, out in zip(PROMPTS, outs):
        ref = model.generate(
            torch.tensor([p]),
            max_new_tokens=NEW,
            do_sample=False,
            eos_token_id=None,  # like ignore_eos (min_new_tokens would mask EOS instead)
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        tokens = ref.sequences[0, len(p) :].tolist()
        ref_lp = torch.stack([torch.log_softmax(lg[0].float(), -1)[t] for lg, t in zip(ref.logits, tokens)])
        assert out.output_token_ids == tokens
        assert (ref_lp - torch.tensor(out.logprobs)).abs().max().item() <= 1e-4
    assert len({t for o in outs for t in o.output_token_ids}) > 4, (
        "degenerate random model: test would prove little"
    )


def test_sampled_logprobs_are_of_tempered_softmax():
    """Log-probs at T != 1 are under softmax(logits / T): compare with one full forward of transformers."""
    model = hf_model("qwen3")
    t = 0.7
    (out,) = run_all(
        engine_for(model), [PROMPTS[2]], SamplingParams(temperature=t, max_new_tokens=NEW, seed=3)
    )
    seq = torch.tensor([PROMPTS[2] + out.output_token_ids])
    with torch.no_grad():
        logits = model(seq).logits[0, len(PROMPTS[2]) - 1 : -1].float()
    ref = torch.log_softmax(logits / t, -1).gather(1, torch.tensor(out.output_token_ids)[:, None])[:, 0]
    assert (ref - torch.tensor(out.logprobs)).abs().max().item() <= 1e-4
