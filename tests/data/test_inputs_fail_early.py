"""Bad inputs found after the config is read still stop before anything starts, with one line naming them."""

import os

import pytest

from laminar.cli import main
from laminar.data.dataset import DatasetError, load_file
from laminar.tasks.warmup import default_warmup_dir


def test_an_empty_dataset_is_an_error_naming_the_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n")
    with pytest.raises(DatasetError, match=r"empty.jsonl has no rows .*'prompt'"):
        load_file(empty)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("task.name={empty}", "empty.jsonl has no rows"),
        ("task.name={bad_row}", "bad.jsonl row 1: missing field 'prompt'"),
        ("task.reward=no_such_reward_mod:score", "cannot import module 'no_such_reward_mod'"),
        ("task.reward=laminar.rewards.reverse:nope", "has no function 'nope'"),
    ],
)
def test_laminar_train_stops_with_one_line_before_any_actor_starts(tmp_path, capsys, override, message):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1 2 ="}\n{"question": "x"}\n')
    arg = override.format(empty=tmp_path / "empty.jsonl", bad_row=tmp_path / "bad.jsonl")
    assert main(["train", arg, f"run.out={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_the_warm_start_is_found_beside_the_package_not_in_the_working_directory(tmp_path, monkeypatch):
    here = default_warmup_dir()
    monkeypatch.chdir(tmp_path)
    assert default_warmup_dir() == here and here.is_absolute()
    assert (here.parent.parent / "pyproject.toml").is_file()  # a source checkout: RUN_ROOT/runs/warmup
    assert os.path.commonpath([here, tmp_path]) != str(tmp_path)
