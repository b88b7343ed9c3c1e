"""The algorithms beside GRPO (README "Algorithms"), each against numbers worked out by hand: the advantages of
a two-group batch, and the loss and its gradient on a few tokens; then the trainer's step with each one, the
same whatever the micro-batching (the sequence terms are whole sequences, normalised over the mini-batch)."""

from __future__ import annotations

import math

import pytest
import torch

from laminar.config import ConfigError, RolloutConfig, TrainerConfig
from laminar.configure import load_config
from laminar.trainer.grpo import GRPOConfig, advantages, grpo_loss
from laminar.trainer.trainer import Trainer
from tests.trainer.test_trainer import make_groups, tiny_model

# two groups: three samples, then two; each trajectory's trained tokens weigh REINFORCE++'s whitening
REWARDS = [[1.0, 0.0, 0.0], [2.0, 0.0]]
LENGTHS = [[2, 1, 3], [4, 2]]


@pytest.mark.parametrize(
    ("kind", "want"),
    [
        # (r - mean) / (population std + eps): group 1 mean 1/3, std sqrt(2/9); group 2 mean 1, std 1
        ("grpo", [[math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)], [1.0, -1.0]]),
        ("drgrpo", [[2 / 3, -1 / 3, -1 / 3], [1.0, -1.0]]),  # r - mean
        ("rloo", [[1.0, -0.5, -0.5], [2.0, -2.0]]),  # r - the mean of the others
        # r whitened over the batch's 12 tokens: mean (2 x 1 + 4 x 2) / 12 = 5/6, unbiased variance 29/33
        (
            "reinforce_pp",
            [
                [x / math.sqrt(29 / 33) for x in (1 / 6, -5 / 6, -5 / 6)],
                [x / math.sqrt(29 / 33) for x in (7 / 6, -5 / 6)],
            ],
        ),
        # r - group mean = [2/3, -1/3, -1/3], [1, -1]; over the tokens: mean 1/6, unbiased variance 7/11
        (
            "reinforce_pp_baseline",
            [
                [x / math.sqrt(7 / 11) for x in (0.5, -0.5, -0.5)],
                [x / math.sqrt(7 / 11) for x in (5 / 6, -7 / 6)],
            ],
        ),
    ],
)
def test_advantages_of_a_two_group_batch(kind, want):
    got = advantages(REWARDS, LENGTHS, kind)
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-5), kind


def test_grpo_advantages_are_group_advantages_unchanged():
    from laminar.trainer.grpo import group_advantages

    assert advantages(REWARDS, LENGTHS, "grpo") == group_advantages(REWARDS)
    assert advantages([[3.0], [1.0, 1.0]], [[2], [1, 1]], "rloo") == [[0.0], [0.0, 0.0]]  # no baseline


def _loss(cfg: GRPOConfig, logp: list[float], adv: list[float], lengths: list[int], num_seqs: int, **kw):
    lp = torch.tensor(logp, requires_grad=True)
    mask = kw.pop("mask", torch.ones(len(logp)))
    loss, m = grpo_loss(
        lp,
        torch.zeros(len(logp)),
        torch.tensor(adv),
        mask,
        cfg,
        num_tokens=len(logp),
        seq_lengths=lengths,
        num_seqs=num_seqs,
        **kw,
    )
    loss.backward()
    return loss.item(), lp.grad.tolist(), m


def test_gspo_ratio_is_the_sequences_geometric_mean_clipped_as_one():
    """Sequence 1 (A = +1): token ratios 1.0 and 1.5, s = sqrt(1.5) = 1.2247 inside [0.8, 1.28], so both tokens
    pass the gradient, the second too though its own ratio is past 1 + clip_high. Sequence 2 (A = -1): ratio
    0.7 below 0.8: clipped, no gradient. Loss = (-s + 0.8) / 2; d/dlogp_t = -s / 2 (its share of the
    sequence's mean log-ratio) / 2 (sequences)."""
    cfg = GRPOConfig(ratio="sequence", loss_agg="seq_mean_token_mean")
    s = math.sqrt(1.5)
    loss, grad, m = _loss(cfg, [0.0, math.log(1.5), math.log(0.7)], [1.0, 1.0, -1.0], [2, 1], 2)
    assert loss == pytest.approx((-s + 0.8) / 2, abs=1e-6)
    assert grad == pytest.approx([-s / 4, -s / 4, 0.0], abs=1e-6)
    assert m["ratio_sum"] == pytest.approx(2 * s + 0.7, abs=1e-6) and m["clip_frac_sum"] == 1
    # the token ratio clips the second token of sequence 1 instead
    token = GRPOConfig(loss_agg="seq_mean_token_mean")
    _, grad, m = _loss(token, [0.0, math.log(1.5), math.log(0.7)], [1.0, 1.0, -1.0], [2, 1], 2)
    assert grad == pytest.approx([-1 / 4, 0.0, 0.0], abs=1e-6) and m["clip_frac_sum"] == 2


def test_gspo_averages_the_log_ratio_over_trained_tokens_only():
    """A tool's output (mask 0) inside the sequence is neither in its ratio nor in its mean."""
    cfg = GRPOConfig(ratio="sequence", loss_agg="seq_mean_token_mean")
    mask = torch.tensor([1.0, 0.0, 1.0])
    loss, grad, _ = _loss(cfg, [math.log(1.2), 5.0, 0.0], [1.0, 1.0, 1.0], [3], 1, mask=mask)
    s = math.sqrt(1.2)
    assert loss == pytest.approx(-s, abs=1e-6)
    assert grad == pytest.approx([-s / 2, 0.0, -s / 2], abs=1e-6)


def test_the_sequence_mean_losses_against_hand_values():
    """Ratio 1 (logp = old), A = +1 on sequence 1's two tokens, -1 on sequence 2's one token."""
    adv, lengths = [1.0, 1.0, -1.0], [2, 1]
    # Dr.GRPO: token sums over (sequences x the constant 4): (-1 - 1 + 1) / 8; d/dlogp_t = -A_t / 8
    drgrpo = GRPOConfig(loss_agg="seq_mean_token_sum_norm", norm_tokens=4)
    loss, grad, _ = _loss(drgrpo, [0.0, 0.0, 0.0], adv, lengths, 2)
    assert loss == pytest.approx(-1 / 8) and grad == pytest.approx([-1 / 8, -1 / 8, 1 / 8])
    # the mean of each sequence's token mean: ((-1 - 1) / 2 + 1) / 2 = 0; sequence 1's tokens -1/4 each
    seq_mean = GRPOConfig(loss_agg="seq_mean_token_mean")
    loss, grad, _ = _loss(seq_mean, [0.0, 0.0, 0.0], adv, lengths, 2)
    assert loss == pytest.approx(0.0) and grad == pytest.approx([-1 / 4, -1 / 4, 1 / 2])
    # token_mean (GRPO's): (-1 - 1 + 1) / 3
    loss, grad, _ = _loss(GRPOConfig(), [0.0, 0.0, 0.0], adv, lengths, 2)
    assert loss == pytest.approx(-1 / 3) and grad == pytest.approx([-1 / 3, -1 / 3, 1 / 3])


@pytest.mark.parametrize(
    "cfg",
    [
        GRPOConfig(ratio="sequence", loss_agg="seq_mean_token_mean"),
        GRPOConfig(loss_agg="seq_mean_token_sum_norm", norm_tokens=4),
    ],
    ids=["gspo", "drgrpo"],
)
def test_micro_batches_with_the_mini_batchs_sequence_count_add_up_to_the_whole(cfg):
    logp = torch.tensor([0.1, -0.2, 0.3, 0.05, -0.1], requires_grad=True)
    args = (torch.zeros(5), torch.tensor([1.0, 1.0, -1.0, 0.5, 0.5]), torch.ones(5), cfg, 5)
    whole, _ = grpo_loss(logp, *args, seq_lengths=[2, 1, 2], num_seqs=3)
    whole.backward()
    full = logp.grad.clone()
    logp.grad = None
    total = 0.0
    for lo, hi, lengths in ((0, 3, [2, 1]), (3, 5, [2])):
        part, _ = grpo_loss(
            logp[lo:hi], *(a[lo:hi] for a in args[:3]), cfg, 5, seq_lengths=lengths, num_seqs=3
        )
        part.backward()
        total += part.item()
    assert total == pytest.approx(whole.item(), abs=1e-7) and torch.allclose(logp.grad, full, atol=1e-7)


def test_the_default_loss_ignores_the_sequence_arguments():
    """GRPO's token ratio and token mean: the same bytes with or without the sequences' lengths."""
    logp = torch.tensor([[-1.0, -0.5, -2.0]])
    args = (
        torch.tensor([[-1.2, -0.4, -2.0]]),
        torch.tensor([[1.0, 1.0, -0.5]]),
        torch.ones(1, 3),
        GRPOConfig(),
        3,
    )
    plain, m1 = grpo_loss(logp, *args)
    given, m2 = grpo_loss(logp, *args, seq_lengths=[2, 1], num_seqs=2)
    assert torch.equal(plain, given) and m1 == m2


def test_loss_options_are_checked_by_name():
    with pytest.raises(ValueError, match="grpo.advantage='ppo'.*grpo, drgrpo, rloo"):
        GRPOConfig(advantage="ppo")
    with pytest.raises(ValueError, match="grpo.ratio='sequence' needs grpo.loss_agg='seq_mean_token_mean'"):
        GRPOConfig(ratio="sequence")
    with pytest.raises(ValueError, match="norm_tokens"):
        GRPOConfig(loss_agg="seq_mean_token_sum_norm")
    with pytest.raises(ValueError, match="sequences' lengths"):
        grpo_loss(
            torch.zeros(2),
            torch.zeros(2),
            torch.ones(2),
            torch.ones(2),
            GRPOConfig(loss_agg="seq_mean_token_mean"),
            2,
        )


@pytest.mark.parametrize(
    ("override", "names"),
    [
        (
            "trainer.advantage=ppo",
            ["trainer.advantage", "grpo, drgrpo, rloo, reinforce_pp, reinforce_pp_baseline"],
        ),
        (
            "trainer.loss_agg=sum",
            ["trainer.loss_agg", "token_mean, seq_mean_token_mean, seq_mean_token_sum_norm"],
        ),
        ("trainer.ratio=seq", ["trainer.ratio", "token, sequence"]),
        ("trainer.ratio=sequence", ["trainer.loss_agg", "seq_mean_token_mean with trainer.ratio=sequence"]),
    ],
)
def test_run_config_names_the_field_and_the_valid_values(override, names):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    for name in names:
        assert name in str(e.value)


def test_run_config_reaches_the_trainer():
    from laminar.runtime.trainer_group import trainer_args

    cfg = load_config(
        None,
        ["trainer.advantage=rloo", "trainer.ratio=sequence", "trainer.loss_agg=seq_mean_token_mean"],
    )
    grpo = Trainer(**trainer_args(cfg, "", cuda=False), model=tiny_model()).loss
    assert (grpo.advantage, grpo.ratio, grpo.loss_agg) == ("rloo", "sequence", "seq_mean_token_mean")
    assert grpo.norm_tokens == cfg.rollout.max_new_tokens


# their `trainer.` fields; Dr.GRPO's constant is the longest response (`rollout.max_new_tokens`, 8 here)
ALGORITHMS = {
    "drgrpo": dict(advantage="drgrpo", loss_agg="seq_mean_token_sum_norm"),
    "gspo": dict(ratio="sequence", loss_agg="seq_mean_token_mean"),
    "rloo": dict(advantage="rloo"),
    "reinforce_pp": dict(advantage="reinforce_pp"),
    "reinforce_pp_baseline": dict(advantage="reinforce_pp_baseline", loss_agg="seq_mean_token_mean"),
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_step_is_the_same_whatever_the_micro_batching(name):
    """Micro-batches of one sequence and one micro-batch of all take the same update, with two mini-batches: the
    planner cuts between sequences, and the divisors are the mini-batch's."""
    params = []
    for size in (1, 64):
        cfg = TrainerConfig(lr=1e-2, micro_batch=size, mini_batches=2, **ALGORITHMS[name])
        tr = Trainer(cfg, rollout=RolloutConfig(max_new_tokens=8), model=tiny_model())
        m = tr.train_step(make_groups(tr))
        assert m["updates"] == 2 and math.isfinite(m["loss"])
        params.append({k: v.clone() for k, v in tr.model.state_dict().items()})
    moved = max(float((params[0][k] - v).abs().max()) for k, v in tiny_model().state_dict().items())
    assert moved > 1e-4
    for k, v in params[0].items():
        assert float((params[1][k] - v).abs().max()) <= 1e-5, k


# Each algorithm as a user sets it (the README's table), in the same short run as PPO's critic
LEARNERS = {
    "grpo": {},
    "drgrpo": {"advantage": "drgrpo", "loss_agg": "seq_mean_token_sum_norm"},
    "rloo": {"advantage": "rloo"},
    "reinforce_pp": {"advantage": "reinforce_pp", "kl_coef": 0.01},
    "reinforce_pp_baseline": {"advantage": "reinforce_pp_baseline"},
    "gspo": {"ratio": "sequence", "loss_agg": "seq_mean_token_mean", "clip_low": 3e-4, "clip_high": 4e-4},
}


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_each_algorithm_raises_the_reward_of_a_short_run(name):
    """12 steps sampled from the trainer's own policy (`test_ppo_critic.rewards_of_a_short_run`): each raises
    the share of low tokens it is rewarded for, from about half, by more than 0.15."""
    from tests.trainer.test_ppo_critic import rewards_of_a_short_run

    tr = Trainer(
        TrainerConfig(lr=3e-3, micro_batch=64, **LEARNERS[name]),
        rollout=RolloutConfig(max_new_tokens=8),
        model=tiny_model(),
    )
    rewards = rewards_of_a_short_run(tr)
    start, end = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert end > start + 0.15, rewards
