"""A trainer checkpoint is data only: a file replaced by a pickle executes nothing and the error names it."""

import os
import pickle

import pytest
import torch

from laminar.trainer.state_files import CheckpointError
from tests.trainer.test_trainer import make_groups, make_trainer, tiny_model


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_has_no_pickle_and_round_trips(tmp_path):
    tr = make_trainer()
    tr.train_step(make_groups(tr, seed=1))
    tr.save_checkpoint(tmp_path / "ckpt")
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert "trainer_state.pt" not in names and not any(n.endswith((".pt", ".pkl", ".bin")) for n in names)
    other = make_trainer(model=tiny_model(seed=99))
    other.load_checkpoint(tmp_path / "ckpt")
    assert other.version == 1
    for name, state in tr.optimizer.state_dict()["state"].items():
        loaded = other.optimizer.state_dict()["state"][name]
        assert torch.equal(state["exp_avg"], loaded["exp_avg"]) and torch.equal(state["step"], loaded["step"])


@pytest.mark.parametrize("victim", ["trainer_state.json", "trainer_state.safetensors", "model.safetensors"])
def test_a_file_replaced_by_a_pickle_runs_nothing_and_is_named(tmp_path, victim):
    tr = make_trainer()
    tr.save_checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "pwned"
    (tmp_path / "ckpt" / victim).write_bytes(pickle.dumps(_RunsCode(marker)))
    with pytest.raises(CheckpointError, match=victim.replace(".", r"\.")):
        make_trainer().load_checkpoint(tmp_path / "ckpt")
    assert not marker.exists()


def test_a_truncated_safetensors_file_is_named(tmp_path):
    tr = make_trainer()
    tr.train_step(make_groups(tr, seed=1))
    tr.save_checkpoint(tmp_path / "ckpt")
    f = tmp_path / "ckpt" / "trainer_state.safetensors"
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="trainer_state.safetensors"):
        make_trainer().load_checkpoint(tmp_path / "ckpt")
