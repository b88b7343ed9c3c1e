"""PPO with a learned critic (`trainer.advantage=gae`): GAE, the whitening and the clipped value loss against their
definitions; the trainer's step with the critic, the same whatever the micro-batching; the critic fitting the
returns of a fixed batch; its checkpoint folder; and a short run that raises the reward."""

from __future__ import annotations

import math

import pytest
import torch

from laminar.config import ConfigError, RolloutConfig, TrainerConfig
from laminar.configure import load_config
from laminar.data.records import Trajectory
from laminar.trainer.grpo import gae, value_loss, whiten_tokens
from laminar.trainer.state_files import CheckpointError
from laminar.trainer.trainer import Trainer
from tests.trainer.test_trainer import VOCAB, make_groups, tiny_model


def gae_by_definition(r: float, v: list[float], gamma: float, lam: float) -> list[float]:
    """A_t = sum over l of (gamma lam)^l delta_{t+l}, delta_t = r_t + gamma V_{t+1} - V_t, summed term by term."""
    rewards = [0.0] * (len(v) - 1) + [r]
    nxt = v[1:] + [0.0]
    deltas = [rewards[t] + gamma * nxt[t] - v[t] for t in range(len(v))]
    return [sum((gamma * lam) ** k * deltas[t + k] for k in range(len(v) - t)) for t in range(len(v))]


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (1.0, 0.0), (0.9, 0.8), (0.99, 0.95)])
def test_gae_is_its_definition(gamma, lam):
    values = [[0.5, -0.25, 1.0, 0.125], [0.3], []]
    rewards = [1.0, -2.0, 3.0]
    advs, rets = gae(rewards, values, gamma, lam)
    for a, ret, r, v in zip(advs, rets, rewards, values):
        assert a == pytest.approx(gae_by_definition(r, v, gamma, lam))
        assert ret == pytest.approx([x + y for x, y in zip(a, v)])
    if (gamma, lam) == (1.0, 1.0):  # the outcome reward less the value of each state
        assert advs[0] == pytest.approx([1.0 - x for x in values[0]])
    if lam == 0.0:  # one-step TD errors
        assert advs[0] == pytest.approx(
            [gamma * -0.25 - 0.5, gamma * 1.0 + 0.25, gamma * 0.125 - 1.0, 1.0 - 0.125]
        )


def test_whitening_is_over_every_token_of_the_batch():
    advs = [[1.0, 2.0, 3.0], [4.0], []]
    flat = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    want = ((flat - flat.mean()) / torch.sqrt(flat.var(unbiased=True) + 1e-8)).tolist()
    out = whiten_tokens(advs)
    assert [len(a) for a in out] == [3, 1, 0]
    assert out[0] + out[1] == pytest.approx(want)


def test_the_value_loss_clips_against_hand_values():
    old = torch.tensor([0.0, 0.0, 1.0])
    new = torch.tensor([1.0, -0.2, 1.0], requires_grad=True)
    ret = torch.tensor([2.0, 0.5, 1.0])
    mask = torch.tensor([1.0, 1.0, 0.0])
    loss, m = value_loss(new, old, ret, mask, clip=0.5, num_tokens=4)
    # token 0: unclipped (1-2)^2 = 1, clipped (0.5-2)^2 = 2.25 -> 2.25; token 1: (-0.2-0.5)^2 = 0.49 both ways
    assert float(loss.detach()) == pytest.approx(0.5 * (2.25 + 0.49) / 4)
    assert m["value_clipped_sum"] == 1.0 and m["value_loss_sum"] == pytest.approx(0.5 * (2.25 + 0.49))
    loss.backward()  # the clipped term has no gradient: token 0 gets none, token 1 gets (v - R) / 4
    assert new.grad.tolist() == pytest.approx([0.0, (-0.2 - 0.5) / 4, 0.0])


def gae_trainer(micro_batch: int = 64, seed: int = 0, **kw) -> Trainer:
    kw = {"lr": 1e-2, "critic_lr": 1e-2, **kw}
    cfg = TrainerConfig(micro_batch=micro_batch, advantage="gae", **kw)
    return Trainer(cfg, rollout=RolloutConfig(max_new_tokens=8), model=tiny_model(seed=seed))


def test_a_gae_step_is_the_same_whatever_the_micro_batching():
    states = []
    for size in (1, 64):
        tr = gae_trainer(size, mini_batches=2)
        m = tr.train_step(make_groups(tr))
        assert m["updates"] == 2 and math.isfinite(m["loss"]) and math.isfinite(m["value_loss"])
        states.append(
            (
                {k: v.clone() for k, v in tr.model.state_dict().items()},
                {k: v.clone() for k, v in tr.critic.model.state_dict().items()},
            )
        )
    (policy_1, critic_1), (policy_all, critic_all) = states
    assert (
        max(float((critic_1[k] - tiny_critic).abs().max()) for k, tiny_critic in critic_all.items()) <= 1e-5
    )
    for k, v in policy_1.items():
        assert float((policy_all[k] - v).abs().max()) <= 1e-5, k
    assert float(critic_1["head.weight"].abs().max()) > 1e-4  # the head moved off its zero start


def test_the_critic_fits_the_returns_of_a_fixed_batch():
    tr = gae_trainer(lr=1e-9)  # the policy all but still: the returns stay the batch's rewards
    groups = make_groups(tr, num_groups=3, n=4)
    first = tr.train_step(groups)
    assert first["value_mean"] == 0.0  # a zero head at the start: the advantages are the rewards, whitened
    losses = [tr.train_step(groups)["value_loss"] for _ in range(30)]
    assert losses[-1] < 0.25 * first["value_loss"], (first["value_loss"], losses[-5:])


def test_the_critic_is_in_the_checkpoint_and_comes_back(tmp_path):
    tr = gae_trainer()
    tr.train_step(make_groups(tr))
    tr.save_checkpoint(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt" / "critic").iterdir()) == [
        "optimizer",
        "state.json",
        "weights",
    ]
    back = gae_trainer(seed=1)
    back.load_checkpoint(tmp_path / "ckpt")
    for (n, p), q in zip(tr.critic.model.named_parameters(), back.critic.model.parameters()):
        assert torch.equal(p, q), n
        assert torch.equal(
            tr.critic.optimizer.state[p]["exp_avg_sq"], back.critic.optimizer.state[q]["exp_avg_sq"]
        )
    # the next step is the same from the original and from the restored trainer
    groups = make_groups(tr, seed=3, version=1)
    assert tr.train_step(groups)["value_loss"] == pytest.approx(
        back.train_step(groups)["value_loss"], rel=1e-6
    )

    plain = Trainer(TrainerConfig(lr=1e-2), model=tiny_model())
    plain.save_checkpoint(tmp_path / "grpo")
    with pytest.raises(CheckpointError, match="no critic in this checkpoint"):
        gae_trainer().load_checkpoint(tmp_path / "grpo")


def test_gae_settings_are_checked_by_name():
    assert load_config(None, ["trainer.advantage=gae", "trainer.num_workers=2"]).trainer.num_workers == 2
    with pytest.raises(ConfigError, match="trainer.gae_lambda"):
        load_config(None, ["trainer.advantage=gae", "trainer.gae_lambda=1.5"])


@torch.no_grad()
def sample(model, prompt: list[int], n: int, length: int) -> list[list[int]]:
    ids = torch.tensor([prompt] * n)
    for _ in range(length):
        probs = model(ids).logits[:, -1].float().softmax(-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1)], 1)
    return ids[:, len(prompt) :].tolist()


def rewards_of_a_short_run(tr: Trainer) -> list[float]:
    """The reward of each of 12 steps of 4 prompts x 4 samples drawn from the trainer's own policy, seeded: the
    share of response tokens from the lower half of the vocabulary (about half at the start)."""
    torch.manual_seed(0)
    rewards = []
    for step in range(12):
        groups = []
        for g in range(4):
            prompt = [1, 3 + (step * 4 + g) % (VOCAB - 3)]
            trajs = [
                Trajectory(f"{step}:{g}:{i}", g, i, prompt, resp, [0.0] * len(resp), tr.version)
                for i, resp in enumerate(sample(tr.model, prompt, 4, 6))
            ]
            for t, lp in zip(trajs, tr.response_logprobs(trajs)):
                t.logprobs = lp
                t.reward = sum(x < VOCAB // 2 for x in t.response_ids) / len(t.response_ids)
            groups.append(trajs)
        rewards.append(tr.train_step(groups)["reward_mean"])
    return rewards


def test_ppo_with_a_critic_raises_the_reward():
    rewards = rewards_of_a_short_run(gae_trainer(lr=3e-3, critic_lr=3e-3))
    start, end = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert end > start + 0.15, rewards
