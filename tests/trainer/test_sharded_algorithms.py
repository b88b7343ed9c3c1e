"""The sequence-level algorithms and PPO's critic on the sharded trainer (FSDP2 over gloo, 2 CPU ranks) against
one process: GSPO's ratio needs each sequence whole on one rank, and the sequence means divide by the whole
mini-batch's sequence count, never a rank's or a micro-batch's; the critic is sharded as the policy, its
advantages are whitened over every rank's tokens, and its checkpoint written by two ranks resumes on one."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from laminar.config import RolloutConfig, TrainerConfig
from laminar.trainer.trainer import Trainer
from tests.trainer.test_sharded import batch, model

# the trainer's arguments of each: its config, and for Dr.GRPO the longest response (its constant)
ALGORITHMS = {
    "gspo": dict(
        cfg=TrainerConfig(
            lr=1e-3,
            micro_batch=3,
            mini_batches=2,
            ratio="sequence",
            loss_agg="seq_mean_token_mean",
            clip_low=0.01,
            clip_high=0.01,
        )
    ),
    # PPO with a learned critic; the KL term on too, so a rank's idle passes run the policy, the reference and
    # the critic (`test_sharded.batch` leaves the ranks with different numbers of micro-batches)
    "gae": dict(
        cfg=TrainerConfig(
            lr=1e-3, micro_batch=3, mini_batches=2, advantage="gae", critic_lr=1e-3, kl_coef=0.5
        )
    ),
    "drgrpo": dict(
        cfg=TrainerConfig(
            lr=1e-3, micro_batch=3, mini_batches=2, advantage="drgrpo", loss_agg="seq_mean_token_sum_norm"
        ),
        rollout=RolloutConfig(max_new_tokens=20),
    ),
}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_two_ranks_take_the_same_step_as_one(name, two_ranks):
    single = Trainer(**ALGORITHMS[name], model=model())
    plan = single.plan([t.num_tokens for g in batch() for t in g])
    every = sorted(i for _, micro in plan for mb in micro for i in mb or [])
    assert every == list(range(20))  # each sequence in exactly one micro-batch, whole
    m = single.train_step(batch())
    got = load_file(str(two_ranks / "algorithms" / name / "params.safetensors"))
    for k, v in single.model.state_dict().items():
        if k != "lm_head.weight":  # tied: model.embed_tokens.weight
            assert float((got[k] - v).abs().max()) <= 1e-5, k
    assert got["metric.loss"].tolist()[0] == pytest.approx(m["loss"], abs=1e-5)
    if single.critic is None:
        return
    assert got["metric.loss"].tolist()[1] == pytest.approx(m["value_loss"], abs=1e-6)
    assert got["metric.loss"].tolist()[2] == pytest.approx(m["value_grad_norm"], rel=1e-4)
    for k, v in single.critic.model.state_dict().items():
        assert float((got[f"critic.{k}"] - v).abs().max()) <= 1e-5, k
    # the two ranks' checkpoint, critic and all, resumes on one rank where the single trainer stands
    back = Trainer(**ALGORITHMS[name], model=model())
    back.load_checkpoint(two_ranks / "algorithms" / name / "ckpt")
    pairs = zip(single.critic.model.named_parameters(), back.critic.model.parameters())
    for (n, p), q in pairs:
        assert float((p.detach() - q.detach()).abs().max()) <= 1e-5, n
        for moment in ("exp_avg", "exp_avg_sq"):
            a, b = single.critic.optimizer.state[p][moment], back.critic.optimizer.state[q][moment]
            assert float((a - b).abs().max()) <= 1e-6 + 1e-4 * float(a.abs().max()), (n, moment)
