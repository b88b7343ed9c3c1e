"""The trainer's log-prob under top-k/top-p: the engine's cut taken on the trainer's own logits, plus the target
(`PolicyLogprobs`' docstring), against references written here."""

from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from laminar.config import ConfigError, RolloutConfig
from laminar.configure import load_config
from laminar.trainer.logprobs import PolicyLogprobs, _ChunkedLogprob, chunked_logprobs, truncate
from laminar.trainer.trainer import Trainer
from tests.engine.test_truncated_sampling import SETTINGS, reference_kept, reference_logprob
from tests.trainer.test_engine_agreement import tiny_model
from tests.trainer.test_sharded import CFG, batch, model

TRUNCATED = RolloutConfig(top_k=8, top_p=0.8)  # the rollout's cut, which the trainer's log-probs take too


def reference_with_target(scaled_row: torch.Tensor, token: int, top_k: int, top_p: float) -> float:
    """The documented value for any target: softmax over the kept tokens and the target, at the target."""
    kept = set(reference_kept(scaled_row, top_k, top_p).tolist()) | {token}
    row = scaled_row.double()
    return (row[token] - row[sorted(kept)].logsumexp(-1)).item()


def random_head(rows: int = 40, vocab: int = 300, hidden: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g) * 0.6
    return h, w, torch.randint(0, vocab, (rows,), generator=g)


@pytest.mark.parametrize("top_k,top_p", SETTINGS)
def test_chunked_logprobs_are_the_truncated_softmax_and_finite_outside_the_cut(top_k, top_p):
    h, w, targets = random_head()
    scaled = (h @ w.T) / 0.7
    targets[:20] = scaled[:20].argmax(-1)  # half the rows ask for a kept token, the rest mostly do not
    out = chunked_logprobs(h, w, targets, 0.7, top_k=top_k, top_p=top_p)
    outside = 0
    for i, (row, tok) in enumerate(zip(scaled, targets.tolist())):
        want = reference_logprob(row, tok, top_k, top_p)
        if want == float("-inf"):  # outside the cut: the cut plus the target, never -inf
            outside += 1
            want = reference_with_target(row, tok, top_k, top_p)
        assert torch.isfinite(out[i])
        assert abs(out[i].item() - want) < 1e-5, (i, out[i].item(), want)
    assert outside >= 10


def test_a_target_outside_the_cut_has_the_log_prob_of_the_cut_plus_itself():
    scaled = torch.tensor([[4.0, 3.0, -2.0, 0.5]])
    eye = torch.eye(4)
    # top-k 1 keeps token 0; token 2 is outside: log(e^-2 / (e^4 + e^-2)), finite
    out = chunked_logprobs(scaled, eye, torch.tensor([2]), top_k=1)
    assert out.item() == pytest.approx(-2.0 - torch.logaddexp(torch.tensor(4.0), torch.tensor(-2.0)).item())
    # a target inside the cut: the cut alone
    out = chunked_logprobs(scaled, eye, torch.tensor([1]), top_k=2)
    assert out.item() == pytest.approx(3.0 - torch.logaddexp(torch.tensor(4.0), torch.tensor(3.0)).item())


@pytest.mark.parametrize("top_k,top_p", [(0, 0.5), (20, 0.8)])
def test_truncated_gradient_matches_autograd_through_the_full_logits(top_k, top_p):
    """The chunked backward (the cut found again from recomputed logits) against autograd through the masked
    log-softmax, in fp64, over several chunks."""
    h, w, targets = random_head(seed=1)
    h, w = h.double(), w.double()
    upstream = torch.randn(len(targets), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grads = []
    for chunked in (True, False):
        hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        if chunked:
            logp = _ChunkedLogprob.apply(hh, ww, targets, 0.7, torch.float64, 7, top_k, top_p)
        else:
            masked, _ = truncate((hh @ ww.T) / 0.7, targets, top_k, top_p)
            logp = torch.log_softmax(masked, -1).gather(1, targets[:, None])[:, 0]
        (logp * upstream).sum().backward()
        grads.append((logp.detach(), hh.grad, ww.grad))
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize("top_k,top_p", [(0, 0.8), (20, 1.0)])
def test_policy_logprobs_are_the_same_on_the_chunked_and_full_logits_paths(top_k, top_p):
    model = tiny_model(vocab_size=64, initializer_range=0.2).eval()
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, 64, (2, 10), generator=g)
    positions = torch.tensor([3, 4, 5, 12, 13, 18])
    targets = ids.flatten()[positions + 1]
    policy = PolicyLogprobs(model, 0.7, top_k, top_p)
    assert policy.chunked
    with torch.no_grad():
        chunked = policy(ids, None, positions, targets)
        policy.chunked = False
        full = policy(ids, None, positions, targets)
        scaled = model(ids).logits.flatten(0, 1)[positions] / 0.7
    want = [reference_with_target(row, t, top_k, top_p) for row, t in zip(scaled, targets.tolist())]
    assert torch.allclose(chunked, full, atol=1e-5)
    assert torch.allclose(chunked.double(), torch.tensor(want, dtype=torch.float64), atol=1e-5)


def test_packed_rows_give_the_padded_truncated_logprobs_and_gradients():
    trajs = [t for g in batch() for t in g]
    out = []
    for packing in ("off", "on"):
        tr = Trainer(replace(CFG, packing=packing), rollout=TRUNCATED, model=model())
        assert tr.packed == (packing == "on")
        logp = tr._forward_logprobs(tr.policy, tr._collate(trajs, [1.0] * len(trajs)))
        (logp * torch.linspace(-1, 1, len(logp))).sum().backward()
        out.append((logp.detach(), [p.grad for p in tr.model.parameters()]))
    (lp_a, grads_a), (lp_b, grads_b) = out
    assert torch.isfinite(lp_a).all() and float((lp_a - lp_b).abs().max()) < 1e-5
    assert all(float((a - b).abs().max()) < 1e-5 for a, b in zip(grads_a, grads_b))


def test_two_ranks_take_the_single_trainers_truncated_step(two_ranks):
    single = Trainer(CFG, rollout=TRUNCATED, model=model())
    loss = single.train_step(batch())["loss"]
    sharded = load_file(str(two_ranks / "truncated" / "params.safetensors"))  # `sharded_ranks.truncated_step`
    assert sharded.pop("metric.loss").item() == pytest.approx(loss, abs=1e-5)
    for k, v in single.model.state_dict().items():
        assert float((sharded[k] - v).abs().max()) <= 1e-5, k


def test_the_rollouts_truncation_reaches_the_trainer():
    from laminar.runtime.trainer_group import trainer_args

    cfg = load_config(None, ["rollout.top_k=20", "rollout.top_p=0.8"])
    tr = Trainer(**trainer_args(cfg, "", cuda=False), model=model())
    assert (tr.loss.top_k, tr.loss.top_p) == (20, pytest.approx(0.8))
    assert (tr.policy.top_k, tr.policy.top_p) == (20, pytest.approx(0.8))
    with pytest.raises(ConfigError, match="rollout.top_k"):
        load_config(None, ["rollout.top_k=-1"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("top_k,top_p", SETTINGS)
def test_cuda_bf16_head_under_truncation(top_k, top_p):
    """Where the fused Triton head would run (CUDA, bf16): the truncated log-probs of the same bf16 logits, and
    gradients close to autograd through the masked fp32 log-softmax."""
    g = torch.Generator(device="cuda").manual_seed(0)
    vocab, rows = 50_001, 300  # one chunk: the reference's logits are the same product
    h = torch.randn(rows, 64, device="cuda", generator=g).bfloat16()
    w = torch.randn(vocab, 64, device="cuda", generator=g) * 0.3
    targets = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    scaled = (h @ w.bfloat16().T).float() / 0.7
    targets[::2] = scaled[::2].argmax(-1)
    upstream = torch.randn(rows, device="cuda", generator=g)
    grads = []
    for eager in (False, True):
        hh, ww = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        if eager:
            masked, _ = truncate((hh @ ww.bfloat16().T).float() / 0.7, targets, top_k, top_p)
            logp = torch.log_softmax(masked, -1).gather(1, targets[:, None])[:, 0]
        else:
            logp = chunked_logprobs(hh, ww, targets, 0.7, torch.bfloat16, top_k, top_p)
            want = [reference_with_target(r, t, top_k, top_p) for r, t in zip(scaled.cpu(), targets.tolist())]
            assert torch.allclose(
                logp.detach().cpu().double(), torch.tensor(want, dtype=torch.float64), atol=1e-5
            )
        (logp * upstream).sum().backward()
        grads.append((hh.grad.float(), ww.grad.float()))
    for a, b in zip(*grads):
        assert ((a - b).norm() / b.norm()).item() < 2e-2
