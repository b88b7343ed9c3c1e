from pathlib import Path

import pytest

from laminar.config import ConfigError, load_config


def test_defaults_are_the_demo_and_valid():
    cfg = load_config()
    assert cfg.schedule.name == "laminar" and cfg.rollout.replicas >= 3


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  lr: 0.001\n  steps: 7\nschedule: sync\n")
    cfg = load_config(path, ["trainer.lr=1e-5", "rollout.replicas=4", "repack.enabled=false"])
    assert cfg.trainer.lr == 1e-5 and cfg.trainer.steps == 7
    assert cfg.rollout.replicas == 4 and cfg.repack.enabled is False and cfg.schedule.name == "sync"


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("trainer.lrr=1", ["trainer.lrr", "lr"]),
        ("rollout.replicas=0", ["rollout.replicas", "at least 1"]),
        ("schedule=fastest", ["schedule.name", "laminar"]),
        ("trainer.lr=abc", ["trainer.lr", "number"]),
        ("model.path=/does/not/exist", ["model.path", "config.json"]),
        ("trainer.group_size=1", ["trainer.group_size", "at least 2"]),
        ("rollout", ["section.field=value"]),
        ("buffer.sampler=lifo", ["buffer.sampler", "oldest", "module:function"]),
    ],
)
def test_bad_values_name_the_field_and_what_is_valid(override, names):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    for name in names:
        assert name in str(err.value)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("path", sorted(Path(__file__).parent.parent.glob("configs/*.yaml")), ids=str)
def test_every_shipped_config_loads(path, tiny_model_dir):
    """The configs under configs/ are run as they are; each must load and validate (the model they name is
    written on the machine that runs them, so a local one stands in)."""
    cfg = load_config(path, [f"model.path={tiny_model_dir}"])
    assert cfg.model.path == str(tiny_model_dir)
