"""A non-finite loss or gradient never reaches the weights: the step is skipped, counted, and too many in a row
stop training; non-finite weights are never published."""

import math

import pytest
import torch

from laminar.config import ConfigError
from laminar.configure import load_config
from laminar.trainer.finite import NonFiniteError
from tests.trainer.test_trainer import make_groups, make_trainer


def weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def poisoned(groups):
    groups[0][0].reward = math.nan  # the group's advantages, then the loss, become NaN
    return groups


def test_a_nonfinite_step_is_skipped_and_leaves_the_weights_and_optimizer_alone():
    tr = make_trainer()
    before = weights(tr)
    m = tr.train_step(poisoned(make_groups(tr)))
    assert m["nonfinite"] and m["nonfinite_steps"] == 1 and math.isnan(m["loss"])
    assert tr.version == m["version"] == 1  # the batch is consumed; the version still counts steps
    for k, v in weights(tr).items():
        assert torch.equal(v, before[k]), k
    assert not tr.optimizer.state  # AdamW never stepped
    ok = tr.train_step(make_groups(tr, seed=1))
    assert not ok["nonfinite"] and math.isfinite(ok["loss"]) and tr.nonfinite_in_a_row == 0
    assert any(not torch.equal(v, before[k]) for k, v in weights(tr).items())


def test_training_stops_after_the_configured_number_of_nonfinite_steps_in_a_row():
    tr = make_trainer(max_nonfinite_steps=2)
    tr.train_step(poisoned(make_groups(tr)))
    tr.train_step(make_groups(tr, seed=1))  # a good step in between resets the count
    tr.train_step(poisoned(make_groups(tr, seed=2)))
    before = weights(tr)
    with pytest.raises(NonFiniteError, match=r"2 trainer steps in a row .*trainer.max_nonfinite_steps=2"):
        tr.train_step(poisoned(make_groups(tr, seed=3)))
    assert tr.nonfinite_steps == 3
    for k, v in weights(tr).items():
        assert torch.equal(v, before[k]), k
    tr.check_finite()  # what a checkpoint after the error would save is finite


def test_nonfinite_weights_are_never_published():
    tr = make_trainer()
    with torch.no_grad():
        tr.model.model.layers[0].mlp.up_proj.weight[0, 0] = math.inf
    with pytest.raises(NonFiniteError, match="'model.layers.0.mlp.up_proj.weight'"):
        tr.named_weights()
    with torch.no_grad():
        tr.model.model.layers[0].mlp.up_proj.weight[0, 0] = 0.0
        tr.model.model.norm.weight[1] = math.nan
        tr.model.model.layers[0].self_attn.q_proj.weight[2, 1] = -math.inf
    with pytest.raises(NonFiniteError, match=r"'model.layers.0.self_attn.q_proj.weight' and 1 more"):
        tr.check_finite()
    assert tr.nonfinite_flags().sum() == 2
    with pytest.raises(ConfigError, match="trainer.max_nonfinite_steps=0"):
        load_config(None, ["trainer.max_nonfinite_steps=0"])


def test_the_published_cast_is_checked_in_one_reduction_and_named_when_bad():
    tr = make_trainer()
    tr.publish_dtype = "bfloat16"
    shards = tr.weight_shards(check=False)
    assert all(s.local.dtype == torch.bfloat16 for s in shards)
    tr.raise_nonfinite(tr.published_nonfinite(), summary=True)  # finite: nothing raised
    with torch.no_grad():
        tr.model.model.norm.weight[0] = 3.4e38  # finite in fp32, inf in bf16
    tr.weight_shards(check=False)
    with pytest.raises(NonFiniteError, match="overflow bfloat16"):
        tr.raise_nonfinite(tr.published_nonfinite(), summary=True)
    with torch.no_grad():
        tr.model.model.norm.weight[0] = math.nan
    tr.weight_shards(check=False)
    with pytest.raises(NonFiniteError, match="'model.norm.weight'"):
        tr.raise_nonfinite(tr.published_nonfinite(), summary=True)
