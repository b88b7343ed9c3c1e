import random

import pytest
import torch
from transformers import LlamaForCausalLM

from laminar.config import TrainerConfig
from laminar.data.records import Trajectory
from laminar.engine.model_dir import ModelPathError, check_model_dir
from laminar.trainer.trainer import Trainer
from tests.tiny import tiny_llama

VOCAB = 14


def tiny_model(tie: bool = False, seed: int = 0) -> LlamaForCausalLM:
    return tiny_llama(VOCAB, seed, num_hidden_layers=1, tie_word_embeddings=tie, pad_token_id=0)


def make_groups(trainer: Trainer, num_groups: int = 3, n: int = 4, seed: int = 0, version: int = 0):
    """Random groups whose behaviour log-probs are the trainer's own (an on-policy rollout)."""
    rng = random.Random(seed)
    groups = []
    for g in range(num_groups):
        prompt = [1] + [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 6))]
        trajs = []
        for i in range(n):
            resp = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, 8))]
            trajs.append(
                Trajectory(f"{g}:{i}", g, i, prompt, resp, [0.0] * len(resp), version, reward=rng.random())
            )
        for t, lp in zip(trajs, trainer.response_logprobs(trajs)):
            t.logprobs = lp
        groups.append(trajs)
    return groups


def make_trainer(model=None, compute_dtype: str = "", publish_dtype: str = "", **kw) -> Trainer:
    """A trainer of `tiny_model()`; `kw` are run config `trainer.` fields."""
    cfg = TrainerConfig(lr=1e-2, micro_batch=5, **kw)
    return Trainer(cfg, compute_dtype=compute_dtype, publish_dtype=publish_dtype, model=model or tiny_model())


def test_train_step_reports_metrics_and_bumps_the_version():
    tr = make_trainer()
    groups = make_groups(tr)
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    m = tr.train_step(groups)
    assert tr.version == m["version"] == 1
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-5)  # on-policy: first forward equals the rollout
    assert m["logprob_mismatch_abs"] < 1e-5 and m["clip_frac"] == 0
    assert m["tokens"] == sum(t.num_tokens for g in groups for t in g)
    assert m["reward_mean"] == pytest.approx(sum(t.reward for g in groups for t in g) / 12)
    lengths = sorted(len(t.response_ids) for g in groups for t in g)
    assert m["response_len_max"] == lengths[-1] and m["response_len_p50"] == pytest.approx(
        (lengths[5] + lengths[6]) / 2
    )
    assert m["response_len_p50"] <= m["response_len_p90"] <= m["response_len_p99"] <= m["response_len_max"]
    assert m["step_time_s"] > 0
    assert m["peak_memory_gb"] == 0.0  # measured on CUDA only
    assert any(not torch.equal(before[k], v) for k, v in tr.model.state_dict().items())


def test_micro_batch_does_not_change_the_update():
    a, b = make_trainer(), make_trainer()
    b.cfg.micro_batch = 1
    groups = make_groups(a)
    a.train_step(groups)
    b.train_step(groups)
    for (k, va), vb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.allclose(va, vb, atol=1e-6), k


def test_micro_batches_by_padded_tokens_go_longest_first_and_do_not_change_the_update():
    tr = make_trainer(micro_batch_tokens=12)
    cuts = tr.micro_batches([3, 9, 4, 6, 2], [10, 11, 12, 13, 14])
    assert cuts == [[11], [13, 12], [10, 14]]  # padded sizes 9, 2 x 6 = 12, 2 x 3 = 6: none above 12
    assert make_trainer().micro_batches([3, 9, 4], [0, 1, 2]) == [[1, 2, 0]]  # by count: longest first
    a, b = make_trainer(), make_trainer(micro_batch_tokens=16)
    groups = make_groups(a)
    a.train_step(groups)
    b.train_step(groups)
    for (k, va), vb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.allclose(va, vb, atol=1e-6), k


def test_staleness_is_measured_against_the_consuming_version():
    tr = make_trainer()
    tr.train_step(make_groups(tr))
    tr.train_step(make_groups(tr))
    m = tr.train_step(make_groups(tr, version=0) + make_groups(tr, seed=1, version=2))
    assert m["staleness_max"] == 2 and m["staleness_mean"] == pytest.approx(1.0)


def test_decoupled_ppo_with_tis_runs_and_reports_the_mismatch():
    tr = make_trainer(correction="tis", is_cap=2.0, mini_batches=2)
    groups = make_groups(tr)
    for g in groups:
        for t in g:
            t.logprobs = [lp - 0.3 for lp in t.logprobs]  # rollout disagreed with the trainer
    m = tr.train_step(groups)
    assert m["logprob_mismatch_abs"] == pytest.approx(0.3, abs=1e-4)
    assert m["logprob_mismatch_kl"] > 0
    assert m["is_weight_mean"] == pytest.approx(2.0**0 * min(2.0, 1.3498588), abs=1e-3)


@pytest.mark.parametrize("mini_batches, passes", [(1, 0), (2, 1)])
def test_the_proximal_pass_runs_only_when_a_later_update_needs_it(mini_batches, passes):
    """With one update a step the pre-update log-probs are the training forward's own: no extra forward."""
    tr = make_trainer(correction="tis", is_cap=2.0, mini_batches=mini_batches)
    groups = make_groups(tr, num_groups=4)  # scored by the trainer itself
    calls = []
    no_grad = tr._logprobs_no_grad
    tr._logprobs_no_grad = lambda *a: calls.append(1) or no_grad(*a)
    m = tr.train_step(groups)
    assert len(calls) == passes and m["updates"] == mini_batches
    if mini_batches == 1:
        assert m["ratio_mean"] == pytest.approx(1.0) and m["clip_frac"] == 0


@pytest.mark.parametrize("correction", ["none", "tis"])
def test_the_mismatch_is_split_into_same_weights_and_stale_weights(correction):
    """Trajectories of the trainer's own version, scored by it: numerical mismatch only (about 0 here). Those of
    an older version (their log-probs off by 0.5, standing for the drift): reported apart. With one update a
    step and no proximal pass (no correction: the ratio is against the rollout's log-probs), later mini-batches
    are scored by updated weights: stale for every token."""
    tr = make_trainer(correction=correction, mini_batches=1)
    tr.train_step(make_groups(tr))  # version 1
    fresh = make_groups(tr, version=1)
    stale = make_groups(tr, seed=1, version=0)
    for g in stale:
        for t in g:
            t.logprobs = [lp - 0.5 for lp in t.logprobs]
    m = tr.train_step(fresh + stale)
    assert m["logprob_mismatch_same_weights"] < 1e-5
    assert m["logprob_mismatch_stale_weights"] == pytest.approx(0.5, abs=1e-4)
    assert "logprob_mismatch_stale_weights" not in tr.train_step(make_groups(tr, version=2))
    two = make_trainer(correction=correction, mini_batches=2)
    m2 = two.train_step(make_groups(two, num_groups=4))
    assert m2["logprob_mismatch_same_weights"] < 1e-5
    if correction == "none":  # the second mini-batch is scored after the first update
        assert m2["logprob_mismatch_stale_weights"] > 0
    else:  # all scored by the pre-update weights
        assert "logprob_mismatch_stale_weights" not in m2


def test_checkpoint_round_trip_resumes_bit_exact(tmp_path):
    tr = make_trainer()
    tr.train_step(make_groups(tr, seed=1))
    tr.save_checkpoint(tmp_path / "ckpt")
    groups = make_groups(tr, seed=2, version=1)
    m1 = tr.train_step(groups)

    other = make_trainer(model=tiny_model(seed=99))
    other.load_checkpoint(tmp_path / "ckpt")
    assert other.version == 1
    m2 = other.train_step(groups)
    assert m1["loss"] == m2["loss"]
    for (k, va), vb in zip(tr.model.state_dict().items(), other.model.state_dict().values()):
        assert torch.equal(va, vb), k
    assert torch.equal(torch.get_rng_state(), torch.get_rng_state())


def test_load_from_a_checkpoint_dir_as_a_model(tmp_path):
    tr = make_trainer()
    tr.save_checkpoint(tmp_path / "m")
    again = Trainer(TrainerConfig(), str(tmp_path / "m"))
    assert all(
        torch.equal(a, b) for a, b in zip(tr.model.state_dict().values(), again.model.state_dict().values())
    )


def test_named_weights_leave_out_a_tied_head():
    untied = make_trainer().named_weights()
    assert "lm_head.weight" in untied
    tied = make_trainer(model=tiny_model(tie=True)).named_weights()
    assert "lm_head.weight" not in tied and "model.embed_tokens.weight" in tied
    assert all(not v.requires_grad for v in tied.values())


@pytest.mark.parametrize("publish_dtype", ["", "bfloat16"])
def test_publish_specs_give_the_published_layout_before_any_publish(publish_dtype):
    """What the publisher's slots are made from at the trainer's start: the layout of the first publish."""
    from laminar.engine.layout import WeightLayout

    tr = make_trainer(publish_dtype=publish_dtype)
    assert WeightLayout.of_specs(tr.publish_specs()) == WeightLayout.of(tr.named_weights())
    assert make_trainer(lora_rank=2).publish_specs() is None  # LoRA's are known once built


def test_bad_model_paths_say_what_is_missing(tmp_path):
    with pytest.raises(ModelPathError, match="does not exist.*laminar warmup"):
        check_model_dir(tmp_path / "nope")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(ModelPathError, match="is a file"):
        check_model_dir(tmp_path / "f.txt")
    with pytest.raises(ModelPathError, match="no config.json.*f.txt"):
        check_model_dir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelPathError, match="no weights.*model.safetensors"):
        check_model_dir(tmp_path)
    with pytest.raises(ModelPathError, match="no model path"):
        Trainer(TrainerConfig(), "")


def test_mismatched_logprobs_are_rejected():
    tr = make_trainer()
    groups = make_groups(tr)
    groups[0][0].logprobs = groups[0][0].logprobs[:-1]
    with pytest.raises(ValueError, match="0:0"):
        tr.train_step(groups)


def test_kl_penalty_keeps_a_frozen_reference():
    tr = make_trainer(kl_coef=0.1)
    ref_before = {k: v.clone() for k, v in tr.ref_model.state_dict().items()}
    tr.train_step(make_groups(tr))
    tr.train_step(make_groups(tr, seed=1))
    assert all(torch.equal(ref_before[k], v) for k, v in tr.ref_model.state_dict().items())
    assert make_trainer().ref_model is None  # KL-free by default: no reference model held


def test_warm_up_changes_no_weight_no_gradient_and_no_optimizer_state():
    tr = make_trainer()
    before = {k: v.clone() for k, v in tr.model.state_dict().items()}
    tr.warm_up(tokens=256)
    assert all(torch.equal(before[k], v) for k, v in tr.model.state_dict().items())
    assert all(p.grad is None for p in tr.model.parameters())
    assert not tr.optimizer.state and tr.version == 0
