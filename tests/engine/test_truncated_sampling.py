"""Under top-k/top-p the engine records the log-prob of the distribution it samples: the truncated softmax
renormalised over the kept tokens, checked against a reference written here from sort and cumsum."""

import pytest
import torch

from laminar.engine import SamplingParams, sampler

from .helpers import drain, engine_for, hf_model

SETTINGS = [(0, 0.5), (0, 0.8), (20, 1.0), (20, 0.8)]  # (top_k, top_p)


def reference_kept(scaled_row: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Token ids kept by top-k, then top-p of the renormalised remainder (the fewest, best first, whose
    probability reaches top_p), and any token tied with the last of those (bf16 logits tie often)."""
    row = scaled_row.double()
    vals = row.sort(descending=True).values
    n = min(top_k, len(vals)) if top_k > 0 else len(vals)
    if top_p < 1:
        n = min(n, int((vals[:n].softmax(-1).cumsum(-1) < top_p).sum()) + 1)
    return (row >= vals[n - 1]).nonzero()[:, 0]


def reference_logprob(scaled_row: torch.Tensor, token: int, top_k: int, top_p: float) -> float:
    """log of softmax(scaled) restricted to the kept tokens and renormalised, at `token` (-inf if not kept)."""
    kept = reference_kept(scaled_row, top_k, top_p)
    if token not in kept.tolist():
        return float("-inf")
    row = scaled_row.double()
    return (row[token] - row[kept].logsumexp(-1)).item()


@pytest.mark.parametrize("top_k,top_p", SETTINGS)
def test_sampler_logprob_is_of_the_truncated_renormalised_softmax(top_k, top_p):
    g = torch.Generator().manual_seed(top_k + int(100 * top_p))
    bsz, vocab = 64, 1000
    logits = torch.randn(bsz, vocab, generator=g) * 3
    temps = torch.rand(bsz, generator=g) + 0.3
    keys = sampler.row_keys(torch.arange(bsz) * 7919, torch.arange(bsz) + 11)
    ks = torch.full((bsz,), top_k, dtype=torch.int64)
    ps = torch.full((bsz,), top_p, dtype=torch.float32)
    tokens, logprobs = sampler.sample_torch(logits, temps, keys, ks, ps)
    for i in range(bsz):
        want = reference_logprob(logits[i] / temps[i], int(tokens[i]), top_k, top_p)
        assert abs(logprobs[i].item() - want) < 1e-5, (i, logprobs[i].item(), want)


def test_rows_without_a_filter_keep_the_full_softmax_beside_filtered_rows():
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 300, generator=g) * 3
    temps = torch.tensor([1.0, 0.7, 1.0, 0.0])
    keys = sampler.row_keys(torch.arange(4), torch.arange(4))
    ks, ps = torch.tensor([0, 20, 0, 0]), torch.tensor([1.0, 1.0, 0.5, 1.0])
    tokens, logprobs = sampler.sample_torch(logits, temps, keys, ks, ps)
    full = torch.log_softmax(logits / torch.where(temps > 0, temps, 1.0)[:, None], -1)
    for i in (0, 3):  # unfiltered rows, sampled and greedy: the plain softmax as before
        assert abs(logprobs[i].item() - full[i, tokens[i]].item()) < 1e-6
    for i, (k, p) in ((1, (20, 1.0)), (2, (0, 0.5))):
        want = reference_logprob(logits[i] / temps[i], int(tokens[i]), k, p)
        assert abs(logprobs[i].item() - want) < 1e-5


@pytest.mark.parametrize("top_k,top_p", SETTINGS)
def test_engine_records_the_truncated_logprob(top_k, top_p, monkeypatch):
    """Through the whole engine (prefill and decode, fp32 on CPU): every recorded log-prob is the reference's on
    the logits the engine sampled from, and every token is in the kept set."""
    seen = []
    plain = sampler.sample

    def recording(logits, temperature, keys, top_k=None, top_p=None):
        tokens, logprobs = plain(logits, temperature, keys, top_k, top_p)
        seen.append((logits.clone(), temperature.clone(), tokens.clone()))
        return tokens, logprobs

    monkeypatch.setattr(sampler, "sample", recording)
    temperature = 0.8
    engine = engine_for(hf_model("qwen2"))
    params = SamplingParams(
        temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=16, ignore_eos=True, seed=3
    )
    engine.add_request("r", [5, 6, 7, 8], params)
    out = drain(engine)["r"]
    assert len(seen) == len(out.logprobs) == 16
    gaps = []
    for (logits, temps, tokens), recorded, token in zip(seen, out.logprobs, out.output_token_ids):
        assert int(tokens[0]) == token
        scaled = logits[0].float() / temps[0]
        assert token in reference_kept(scaled, top_k, top_p).tolist()
        gaps.append(abs(recorded - reference_logprob(scaled, token, top_k, top_p)))
    assert max(gaps) < 1e-5
    full = [torch.log_softmax(lg[0].float() / temperature, -1)[t].item() for lg, _, t in seen]
    assert max(abs(a - b) for a, b in zip(full, out.logprobs)) > 0.05, "the cut must matter here"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_k,top_p", SETTINGS)
def test_cuda_engine_records_the_truncated_logprob(top_k, top_p, dtype, monkeypatch):
    """The CUDA engine, decode in CUDA graphs: the filtered rows leave the graph's sampler for the torch path,
    and what they record is the reference's on the logits they were drawn from."""
    seen = []
    plain = sampler.sample

    def recording(logits, temperature, keys, top_k=None, top_p=None):
        tokens, logprobs = plain(logits, temperature, keys, top_k, top_p)
        seen.append((logits.float().cpu(), temperature.cpu(), tokens.cpu()))
        return tokens, logprobs

    monkeypatch.setattr(sampler, "sample", recording)
    engine = engine_for(hf_model("qwen2"), device="cuda", dtype=dtype)
    assert engine.runner.graphs, "decode should run in CUDA graphs"
    params = SamplingParams(
        temperature=0.8, top_k=top_k, top_p=top_p, max_new_tokens=16, ignore_eos=True, seed=3
    )
    engine.add_request("r", [5, 6, 7, 8], params)
    out = drain(engine)["r"]
    assert len(seen) == len(out.logprobs) == 16
    for (logits, temps, tokens), recorded, token in zip(seen, out.logprobs, out.output_token_ids):
        assert int(tokens[0]) == token
        assert abs(recorded - reference_logprob(logits[0] / temps[0], token, top_k, top_p)) < 1e-5
