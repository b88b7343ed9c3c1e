"""The trainer recomputes exactly the log-probs the rollout engine records (the contract in ARCHITECTURE.md)."""

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from laminar.data.records import Trajectory
from laminar.engine import Engine, SamplingParams
from laminar.trainer.grpo import GRPOConfig
from laminar.trainer.trainer import Trainer, TrainerConfig


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=14,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg)


def test_trainer_logprobs_match_the_engine_and_weights_round_trip(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    temperature = 0.7
    engine = Engine.from_pretrained(tmp_path, max_num_seqs=8)
    for i in range(6):
        params = SamplingParams(temperature=temperature, max_new_tokens=12, seed=i)
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

    trainer = Trainer(
        TrainerConfig(model_path=str(tmp_path), threads=1, grpo=GRPOConfig(temperature=temperature))
    )
    for t, lp in zip(trajs, trainer.response_logprobs(trajs)):
        assert np.allclose(lp, t.logprobs, atol=1e-4), t.traj_id
    metrics = trainer.train_step([trajs[:3], trajs[3:]])
    assert metrics["logprob_mismatch_abs"] < 1e-4

    engine.load_state_dict(trainer.named_weights(), version=trainer.version)
    assert engine.stats().version == 1
