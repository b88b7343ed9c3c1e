import math

import pytest
import torch

from laminar.trainer.grpo import GRPOConfig, group_advantages, grpo_loss, importance_weights
from tests.trainer.hf_rollout import token_logprobs


def test_advantages_are_normalised_within_each_group():
    adv = group_advantages([[1.0, 0.0, 0.0, 1.0], [5.0, 5.0], [3.0]])
    assert adv[0] == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert adv[1] == [0.0, 0.0]  # no signal when every sample scored the same
    assert adv[2] == [0.0]
    a = torch.tensor(group_advantages([[0.1, 0.7, 0.3]])[0])
    assert float(a.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(a.std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)


def test_token_logprobs_use_temperature():
    logits = torch.tensor([[[2.0, 0.0, -1.0]]])
    target = torch.tensor([[0]])
    for t in (1.0, 0.5):
        want = torch.log_softmax(logits / t, -1)[0, 0, 0]
        assert token_logprobs(logits, target, t).item() == pytest.approx(want.item())


def _loss(logp, old, adv, cfg, **kw):
    logp = torch.tensor([logp], requires_grad=True)
    loss, m = grpo_loss(
        logp, torch.tensor([old]), torch.tensor([adv]), torch.ones(1, len(adv)), cfg, len(adv), **kw
    )
    loss.backward()
    return loss, logp.grad, m


def test_clip_higher_uses_separate_bounds():
    cfg = GRPOConfig(clip_low=0.2, clip_high=0.28)
    # positive advantage: gradient flows up to ratio 1.28, stops beyond it
    _, g, m = _loss([math.log(1.25)], [0.0], [1.0], cfg)
    assert g.abs().sum() > 0 and m["clip_frac_sum"] == 0
    _, g, m = _loss([math.log(1.30)], [0.0], [1.0], cfg)
    assert g.abs().sum() == 0 and m["clip_frac_sum"] == 1
    # negative advantage: the lower bound is 0.8, not 0.72
    _, g, _ = _loss([math.log(0.82)], [0.0], [-1.0], cfg)
    assert g.abs().sum() > 0
    _, g, m = _loss([math.log(0.78)], [0.0], [-1.0], cfg)
    assert g.abs().sum() == 0 and m["clip_frac_sum"] == 1
    # the unclipped side always passes the gradient (min picks the pessimistic term)
    _, g, _ = _loss([math.log(0.5)], [0.0], [1.0], cfg)
    assert g.abs().sum() > 0


def test_loss_is_a_token_level_mean_over_the_mini_batch():
    cfg = GRPOConfig()
    logp = torch.zeros(2, 4, requires_grad=True)
    adv = torch.tensor([[1.0] * 4, [2.0] * 4])
    mask = torch.tensor([[1.0, 0, 0, 0], [1.0, 1, 1, 1]])  # 1 token and 4 tokens
    loss, m = grpo_loss(logp, torch.zeros(2, 4), adv, mask, cfg, num_tokens=5)
    assert loss.item() == pytest.approx(-(1 * 1 + 4 * 2) / 5)  # not the mean of per-sequence means
    assert m["tokens"] == 5
    # split into two micro-batches with the mini-batch's token count: gradients add up to the same
    loss.backward()
    full = logp.grad.clone()
    logp.grad = None
    for b in (0, 1):
        part, _ = grpo_loss(
            logp[b : b + 1], torch.zeros(1, 4), adv[b : b + 1], mask[b : b + 1], cfg, num_tokens=5
        )
        part.backward()
    assert torch.allclose(logp.grad, full)
    assert logp.grad[0, 1:].abs().sum() == 0  # padding gets no gradient


def test_truncated_and_masked_importance_weights():
    prox, behav = torch.log(torch.tensor([1.0, 3.0, 1.5])), torch.zeros(3)
    assert importance_weights(prox, behav, "tis", 2.0).tolist() == pytest.approx([1.0, 2.0, 1.5])
    assert importance_weights(prox, behav, "mis", 2.0).tolist() == pytest.approx([1.0, 0.0, 1.5])
    assert importance_weights(prox, behav, "none", 2.0).tolist() == [1.0, 1.0, 1.0]


def test_decoupled_ppo_ratio_is_against_the_proximal_policy():
    cfg = GRPOConfig(proximal="trainer", is_correction="tis", is_cap=2.0)
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    prox = torch.tensor([[0.0, 0.0]])  # trainer pre-update policy equals the current one: ratio 1
    behav = torch.tensor([[0.0, math.log(1 / 3)]])  # rollout thought token 2 was 3x less likely
    loss, m = grpo_loss(logp, behav, torch.ones(1, 2), torch.ones(1, 2), cfg, 2, proximal=prox)
    assert m["ratio_sum"] == pytest.approx(2.0)
    assert loss.item() == pytest.approx(-(1.0 + 2.0) / 2)  # weights 1 and min(3, 2)
    assert m["mismatch_abs_sum"] == pytest.approx(math.log(3))
    mis = GRPOConfig(proximal="trainer", is_correction="mis", is_cap=2.0)
    loss, m = grpo_loss(logp, behav, torch.ones(1, 2), torch.ones(1, 2), mis, 2, proximal=prox)
    assert loss.item() == pytest.approx(-1.0 / 2) and m["is_masked_sum"] == 1


def test_with_one_update_tis_follows_the_unclipped_gradient_where_the_sampler_clip_would_stop_it():
    """One update a step: the trainer's pre-update log-probs are the policy's own, so tis's ratio is 1 and its clip
    never binds. Its gradient then equals plain PPO's (ratio against the sampler, clipped) on every token plain PPO
    does not clip and whose weight is under the cap, and differs exactly on the clipped ones: there plain PPO's
    gradient is 0 and tis's is not (what `correction_warning` says)."""
    torch.manual_seed(0)
    shape = (4, 64)
    base = torch.randn(shape) * 0.3 - 2.0
    behaviour = base + torch.randn(shape) * 0.3  # the sampler's log-probs, some versions old
    adv = torch.randn(shape[0], 1).expand(shape).contiguous()
    mask = torch.ones(shape)

    def grad(cfg: GRPOConfig) -> tuple[torch.Tensor, dict]:
        logp = base.clone().requires_grad_(True)
        loss, m = grpo_loss(logp, behaviour, adv, mask, cfg, mask.numel(), proximal=base.clone())
        loss.backward()
        return logp.grad, m

    none_grad, none_m = grad(GRPOConfig())
    tis_grad, tis_m = grad(GRPOConfig(proximal="trainer", is_correction="tis", is_cap=2.0))
    assert tis_m["clip_frac_sum"] == 0 and tis_m["ratio_sum"] == pytest.approx(mask.numel())
    rho = torch.exp(base - behaviour)
    clipped = ((rho < 0.8) & (adv < 0)) | ((rho > 1.28) & (adv > 0))
    assert none_m["clip_frac_sum"] == clipped.sum().item() > 0
    same = ~clipped & (rho <= 2.0)
    assert torch.allclose(tis_grad[same], none_grad[same], rtol=1e-5, atol=1e-9)
    assert (none_grad[clipped] == 0).all() and (tis_grad[clipped] != 0).all()


def test_mismatch_kl_estimate_is_zero_when_policies_agree_and_positive_otherwise():
    cfg = GRPOConfig()
    same = grpo_loss(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3), cfg, 3)[1]
    assert same["mismatch_abs_sum"] == 0 and same["mismatch_kl_sum"] == 0
    diff = grpo_loss(torch.full((1, 3), -0.5), torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3), cfg, 3)[
        1
    ]
    assert diff["mismatch_abs_sum"] == pytest.approx(1.5) and diff["mismatch_kl_sum"] > 0


def test_config_rejects_bad_values_by_name():
    with pytest.raises(ValueError, match="is_correction"):
        GRPOConfig(proximal="trainer", is_correction="bogus")
    with pytest.raises(ValueError, match="proximal='trainer'"):
        GRPOConfig(is_correction="tis")
    with pytest.raises(ValueError, match="clip_high"):
        GRPOConfig(clip_high=0)


def test_kl_term_is_the_k3_estimate_on_response_tokens_and_padding_cannot_overflow_it():
    cfg = GRPOConfig(kl_coef=0.5)
    logp = torch.tensor([[-1.0, -2.0, -300.0]])  # the last position is padding
    ref = torch.tensor([[-1.5, -2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, m = grpo_loss(logp, logp, torch.zeros(1, 3), mask, cfg, 2, ref_logp=ref)
    k3 = math.exp(-0.5) + 0.5 - 1.0  # exp(d) - d - 1 with d = ref - logp = -0.5; 0 where they agree
    assert m["kl_sum"] == pytest.approx(k3) and loss.item() == pytest.approx(0.5 * k3 / 2)
    assert "kl_sum" not in grpo_loss(logp, logp, torch.zeros(1, 3), mask, GRPOConfig(), 2, ref_logp=ref)[1]
