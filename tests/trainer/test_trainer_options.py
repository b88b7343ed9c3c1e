"""The trainer options a config reaches: the KL penalty against a frozen reference (the starting weights, never
checkpointed), and several optimizer updates per step."""

from __future__ import annotations

import pytest
import torch

from laminar.config import TrainerConfig
from laminar.trainer.grpo import informative
from laminar.trainer.trainer import Trainer
from tests.trainer.test_trainer import make_groups, make_trainer, tiny_model


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_reference_is_the_starting_policy_frozen_and_reported_as_kl():
    tr = make_trainer(kl_coef=0.1)
    start = weights(tr.model)
    ref = tr.ref_model
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    assert all(p.dtype == torch.float32 for p in ref.parameters())  # bf16 only on CUDA
    assert all(torch.equal(start[k], v) for k, v in ref.state_dict().items())
    first = tr.train_step(make_groups(tr))
    second = tr.train_step(make_groups(tr, seed=1))
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy was the reference during step 1
    assert second["kl"] > 0  # and has moved away from it since
    assert all(torch.equal(start[k], v) for k, v in ref.state_dict().items())
    assert "kl" not in make_trainer().train_step(make_groups(tr))  # KL-free: no reference, no number


def test_the_kl_term_pulls_the_update_towards_the_reference():
    """Same data and steps: with the penalty the policy ends closer to where it started."""
    free, held = make_trainer(), make_trainer(kl_coef=5.0)
    start = weights(free.model)
    for seed in range(4):
        groups = make_groups(free, seed=seed)
        free.train_step(groups)
        held.train_step(groups)

    def moved(tr: Trainer) -> float:
        return sum(float((v - start[k]).pow(2).sum()) for k, v in tr.model.state_dict().items())

    assert moved(held) < moved(free)


def test_a_resumed_trainer_takes_its_reference_from_the_starting_weights_not_the_checkpoint(tmp_path):
    start_dir = tmp_path / "start"
    tiny_model().save_pretrained(start_dir)
    cfg = TrainerConfig(lr=1e-2, kl_coef=0.1)
    tr = Trainer(cfg, str(start_dir))
    tr.train_step(make_groups(tr))
    tr.train_step(make_groups(tr, seed=1))
    tr.save_checkpoint(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.safetensors")) == [
        "model.safetensors",
        "trainer_state.safetensors",
    ]  # the policy and the optimizer; no reference copy

    resumed = Trainer(cfg, str(start_dir))
    resumed.load_checkpoint(tmp_path / "ckpt")
    initial = weights(Trainer(TrainerConfig(), str(start_dir)).model)
    assert all(torch.equal(initial[k], v) for k, v in resumed.ref_model.state_dict().items())
    assert all(torch.equal(a, b) for a, b in zip(tr.model.parameters(), resumed.model.parameters()))
    groups = make_groups(tr, seed=2, version=2)
    assert resumed.train_step(groups)["kl"] == pytest.approx(tr.train_step(groups)["kl"], rel=1e-6)


def test_two_mini_batches_are_two_optimizer_updates_in_one_version():
    tr = make_trainer(mini_batches=2)
    m = tr.train_step(make_groups(tr))
    assert (m["version"], tr.version, m["updates"]) == (1, 1, 2)
    assert {int(s["step"]) for s in tr.optimizer.state.values()} == {2}
    m = tr.train_step(make_groups(tr, seed=1))
    assert (m["version"], m["updates"]) == (2, 2)
    assert make_trainer().train_step(make_groups(tr))["updates"] == 1


def test_a_group_with_equal_rewards_carries_no_signal():
    assert not informative([1.0, 1.0, 1.0]) and not informative([0.0, 0.0])
    assert informative([0.0, 0.5]) and informative([1.0, 1.0, 0.0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_reference_is_bf16_and_a_kl_step_runs(tmp_path):
    start_dir = tmp_path / "start"
    tiny_model().save_pretrained(start_dir)
    tr = Trainer(TrainerConfig(lr=1e-2, kl_coef=0.1), str(start_dir), device="cuda")
    assert all(p.dtype == torch.bfloat16 and p.is_cuda for p in tr.ref_model.parameters())
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())  # fp32 master weights
    tr.train_step(make_groups(tr))
    m = tr.train_step(make_groups(tr, seed=1))
    assert m["kl"] > 0 and m["updates"] == 1 and not m["nonfinite"]


def test_a_bf16_compute_copy_accumulates_fp32_gradients_into_the_master_weights(tmp_path):
    """What a single CUDA trainer does (here forced on CPU): a bf16 copy runs forward and backward over three
    micro-batches, its gradients land in the fp32 master's, the update is the master's, the copy follows it,
    ties stay tied, and the publish and a checkpoint see the master."""
    fp32 = make_trainer(model=tiny_model(tie=True))
    bf16 = make_trainer(model=tiny_model(tie=True), compute_dtype="bfloat16", publish_dtype="bfloat16")
    compute = bf16.master.compute
    assert compute.lm_head.weight is compute.model.embed_tokens.weight
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in compute.parameters())
    start = weights(bf16.model)
    groups = make_groups(fp32)
    fp32.train_step(groups)
    m = bf16.train_step(groups)
    assert m["updates"] == 1 and not m["nonfinite"]
    for (name, a), b in zip(fp32.model.named_parameters(), bf16.model.parameters()):
        # the accumulated (and clipped) gradient of the last update, fp32 in both; bf16 maths, within 3%
        assert b.grad is not None and b.grad.dtype == torch.float32, name
        assert float((a.grad - b.grad).norm()) <= 0.03 * float(a.grad.norm()) + 1e-6, name
    assert all(c.grad is None for c in compute.parameters())  # the copy keeps no gradient
    assert any(not torch.equal(start[k], v) for k, v in bf16.model.state_dict().items())
    for k, v in compute.state_dict().items():
        assert torch.equal(v, bf16.model.state_dict()[k].to(torch.bfloat16)), k
    published = bf16.named_weights()
    assert all(
        torch.equal(published[k], v.to(torch.bfloat16))
        for k, v in bf16.model.state_dict().items()
        if k in published
    )
    bf16.save_checkpoint(tmp_path / "ckpt")
    resumed = make_trainer(model=tiny_model(tie=True, seed=5), compute_dtype="bfloat16")
    resumed.load_checkpoint(tmp_path / "ckpt")
    for k, v in resumed.master.compute.state_dict().items():
        assert torch.equal(v, bf16.model.state_dict()[k].to(torch.bfloat16)), k
