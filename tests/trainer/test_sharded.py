"""The sharded trainer (FSDP2 over gloo, 2 CPU ranks) against the single-process one on the same batch: the
same parameters after a step, the same published bytes, and checkpoints that resume onto 1 or 2 ranks."""

from __future__ import annotations

import random
import socket

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from laminar.config import TrainerConfig
from laminar.data.records import Trajectory
from laminar.engine.layout import WeightLayout
from laminar.engine.weights import flatten_into
from laminar.trainer.trainer import Trainer
from tests.tiny import tiny_llama

# with a KL term: the reference is sharded too, and after a resume (policy != reference) it moves the step
CFG = TrainerConfig(lr=1e-3, micro_batch=3, mini_batches=2, kl_coef=0.5)
VOCAB = 30


def model() -> LlamaForCausalLM:
    return tiny_llama(
        VOCAB, intermediate_size=48, num_attention_heads=4, tie_word_embeddings=True, pad_token_id=0
    )


def batch() -> list[list[Trajectory]]:
    """Five groups of four with uneven lengths, so the ranks' shares and micro-batch counts differ."""
    rng = random.Random(3)
    groups = []
    for g in range(5):
        prompt = [1] + [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 9))]
        group = []
        for i in range(4):
            resp = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 20))]
            lp = [-rng.uniform(1.5, 4.0) for _ in resp]
            group.append(Trajectory(f"{g}:{i}", g, i, prompt, resp, lp, 0, reward=float(rng.random() < 0.5)))
        groups.append(group)
    return groups


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_rank_step(two_ranks):
    """Two ranks' step from the start (its parameters), and the folder of what they wrote: the published
    versions, the checkpoint, and the steps resumed from it and from the single trainer's (`sharded_steps`)."""
    return load_file(str(two_ranks / "sharded" / "params.safetensors")), two_ranks / "sharded"


def test_two_ranks_take_the_same_step_as_one(single, two_rank_step):
    tr, m, _ = single
    sharded, _ = two_rank_step
    for k, v in tr.model.state_dict().items():
        if k == "lm_head.weight":
            continue  # tied: model.embed_tokens.weight
        diff = float((sharded[k] - v).abs().max())
        assert diff <= 1e-5, (k, diff)
    loss, grad_norm, tokens = sharded["metric.loss"].tolist()
    assert loss == pytest.approx(m["loss"], abs=1e-5)
    assert grad_norm == pytest.approx(m["grad_norm"], rel=1e-4)
    assert tokens == m["tokens"]
    assert any(
        float((v - model().state_dict()[k]).abs().max()) > 1e-4 for k, v in tr.model.state_dict().items()
    )


def test_nonfinite_rows_on_one_rank_stop_the_publish_on_every_rank(two_rank_step):
    _, tmp = two_rank_step
    for rank in (0, 1):
        said = (tmp / f"nonfinite{rank}.txt").read_text()
        assert "'model.layers.0.mlp.up_proj.weight'" in said and "neither published nor saved" in said, said


def test_the_published_version_of_two_ranks_is_the_single_trainers_bytes(single, two_rank_step):
    """Each rank wrote only its rows; together they are byte for byte the layout the engine loads. (Equal
    parameters to 1e-5 are not always equal bytes, so the comparison is with the 2-rank parameters, flattened
    the single-process way.)"""
    tr, _, _ = single
    sharded, tmp = two_rank_step
    names = tr.publish_names()
    assert sorted(names) == sorted(
        k for k in sharded if not k.startswith("metric.") and k != "lm_head.weight"
    )
    weights = {k: sharded[k] for k in names}
    layout = WeightLayout.of(weights)
    assert layout == WeightLayout.of(tr.named_weights())
    want = np.zeros(layout.total_bytes, dtype=np.uint8)
    flatten_into(weights, layout, want)
    got = np.frombuffer((tmp / "published.bin").read_bytes(), dtype=np.uint8)
    assert got.tobytes() == want.tobytes()
    # cast to bf16 by each rank into one buffer: the single cast of the same parameters
    bf16 = {k: v.to(torch.bfloat16) for k, v in weights.items()}
    layout16 = WeightLayout.of(bf16)
    want16 = np.zeros(layout16.total_bytes, dtype=np.uint8)
    flatten_into(bf16, layout16, want16)
    assert (tmp / "published-bf16.bin").read_bytes() == want16.tobytes()
    # before any step the weights are the same numbers: the 2-rank publish is the single trainer's, byte for byte
    start = Trainer(CFG, model=model())
    want0 = np.zeros(layout.total_bytes, dtype=np.uint8)
    flatten_into(start.named_weights(), layout, want0)
    assert (tmp / "published0.bin").read_bytes() == want0.tobytes()


def test_a_two_rank_checkpoint_resumes_on_one_rank_and_on_two(single, two_rank_step):
    """From the 2-rank checkpoint: one more step on 1 rank and on 2 ranks gives the same parameters as the
    single-process trainer taking its second step from its own checkpoint."""
    _, tmp = two_rank_step
    ckpt = tmp / "ckpt"
    assert (ckpt / "config.json").is_file() and (ckpt / "model.safetensors.index.json").is_file()
    assert not (ckpt / "sharded").exists() and not list(ckpt.rglob("*.metadata"))  # no pickles

    ref = Trainer(CFG, model=model())
    ref.load_checkpoint(single[2])
    ref.train_step(batch())
    one = Trainer(CFG, model=model())
    one.load_checkpoint(ckpt)
    assert one.version == 1
    one.train_step(batch())
    two = load_file(str(tmp / "resumed-two" / "params.safetensors"))
    for k, v in ref.model.state_dict().items():
        if k == "lm_head.weight":
            continue
        assert float((one.model.state_dict()[k] - v).abs().max()) <= 1e-5, k
        assert float((two[k] - v).abs().max()) <= 1e-5, k


def test_a_one_rank_checkpoint_resumes_on_two_ranks(single, two_ranks):
    ref = Trainer(CFG, model=model())
    ref.load_checkpoint(single[2])
    assert ref.train_step(batch())["kl"] > 0  # the policy has left the reference: the KL term moves this step
    two = load_file(str(two_ranks / "sharded" / "resumed-one" / "params.safetensors"))
    for k, v in ref.model.state_dict().items():
        if k != "lm_head.weight":
            assert float((two[k] - v).abs().max()) <= 1e-5, k
