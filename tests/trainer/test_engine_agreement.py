"""The trainer recomputes exactly the log-probs the rollout engine records (the contract in ARCHITECTURE.md)."""

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from laminar.config import RolloutConfig, TrainerConfig
from laminar.data.records import Trajectory
from laminar.engine import Engine, SamplingParams
from laminar.trainer.trainer import Trainer
from tests.engine.test_truncated_sampling import reference_logprob
from tests.tiny import tiny_llama


def tiny_model(vocab_size: int = 14, initializer_range: float = 0.02) -> LlamaForCausalLM:
    return tiny_llama(vocab_size, pad_token_id=0, initializer_range=initializer_range)


def sampled(engine: Engine, temperature: float, top_k: int = 0, top_p: float = 1.0) -> list[Trajectory]:
    """Two groups of three answers sampled by `engine`, as trajectories with the log-probs it recorded."""
    for i in range(6):
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=12, seed=i)
        engine.add_request(f"{i // 3}:{i % 3}", [1, 3 + i, 5, 7], params)
    done = []
    while engine.has_unfinished():
        done += engine.step().finished
    trajs = []
    for f in sorted(done, key=lambda f: f.request_id):
        g, i = map(int, f.request_id.split(":"))
        trajs.append(
            Trajectory(f.request_id, g, i, f.prompt_token_ids, f.output_token_ids, f.logprobs, 0, reward=i)
        )
    return trajs


def test_trainer_logprobs_match_the_engine_and_weights_round_trip(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    temperature = 0.7
    engine = Engine.from_pretrained(tmp_path, max_num_seqs=8)
    trajs = sampled(engine, temperature)

    trainer = Trainer(TrainerConfig(), str(tmp_path), rollout=RolloutConfig(temperature=temperature))
    for t, lp in zip(trajs, trainer.response_logprobs(trajs)):
        assert np.allclose(lp, t.logprobs, atol=1e-4), t.traj_id
    metrics = trainer.train_step([trajs[:3], trajs[3:]])
    assert metrics["logprob_mismatch_abs"] < 1e-4

    engine.load_state_dict(trainer.named_weights(), version=trainer.version)
    assert engine.stats().version == 1


@pytest.mark.parametrize("top_k,top_p", [(0, 0.5), (0, 0.8), (20, 1.0), (20, 0.8)])
def test_trainer_and_engine_agree_under_top_k_and_top_p(tmp_path, top_k, top_p):
    """Both give the log-prob of the truncated, renormalised softmax (the reference), so the trainer's ratio
    against the rollout is 1 at the same weights."""
    model = tiny_model(vocab_size=64, initializer_range=0.2)  # peaked enough that the cut matters
    model.save_pretrained(tmp_path)
    temperature = 0.7
    trajs = sampled(Engine.from_pretrained(tmp_path, max_num_seqs=8), temperature, top_k, top_p)
    rollout = RolloutConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    trainer = Trainer(TrainerConfig(), str(tmp_path), rollout=rollout)
    cut_matters = 0.0
    for t, lp in zip(trajs, trainer.response_logprobs(trajs)):
        with torch.no_grad():
            logits = model(torch.tensor([t.prompt_ids + t.response_ids])).logits[
                0, len(t.prompt_ids) - 1 : -1
            ]
        scaled = logits / temperature
        ref = [reference_logprob(row, tok, top_k, top_p) for row, tok in zip(scaled, t.response_ids)]
        assert np.allclose(lp, ref, atol=1e-5), t.traj_id
        assert np.allclose(t.logprobs, ref, atol=1e-4), t.traj_id
        assert np.allclose(lp, t.logprobs, atol=1e-4), t.traj_id
        full = torch.log_softmax(scaled, -1).gather(1, torch.tensor(t.response_ids)[:, None])[:, 0]
        cut_matters = max(cut_matters, (full - torch.tensor(ref)).abs().max().item())
    assert cut_matters > 0.05
