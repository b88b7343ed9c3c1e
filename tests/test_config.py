from pathlib import Path

import pytest

from laminar.config import ConfigError, correction_warning, lr_warning
from laminar.configure import load_config


def test_defaults_are_the_demo_and_valid():
    cfg = load_config()
    assert cfg.schedule.name == "laminar" and cfg.rollout.replicas >= 3


def test_the_default_dispatch_bound_is_three_trainer_steps():
    """`buffer.capacity_groups` 0 resolves to 3 x `trainer.groups_per_step` (Laminar's dispatch policy), after
    the file and the overrides, so a smaller step gets a smaller bound; a number given is kept."""
    assert load_config().buffer.capacity_groups == 3 * load_config().trainer.groups_per_step
    assert load_config(None, ["trainer.groups_per_step=4"]).buffer.capacity_groups == 12
    assert load_config(None, ["buffer.capacity_groups=20"]).buffer.capacity_groups == 20


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
        ("trainer.kl_coef=-0.1", ["trainer.kl_coef", "0 (no reference model)"]),
        ("trainer.mini_batches=0", ["trainer.mini_batches", "between 1 and"]),
        ("trainer.mini_batches=1000", ["trainer.mini_batches", "groups_per_step x group_size = 128"]),
        ("trainer.filter_groups=maybe", ["trainer.filter_groups", "true or false"]),
        ("trainer.filter_take_limit=0", ["trainer.filter_take_limit", "at least 1"]),
        ("trainer.reshard_after_forward=false", ["trainer.reshard_after_forward", "num_workers=1"]),
        ("trainer.num_workers=2 trainer.num_gpus=0.5", ["trainer.num_gpus=0.5", "no two ranks share a GPU"]),
        ("buffer.capacity_groups=8", ["buffer.capacity_groups", "0 (three trainer steps)", "(16)"]),
        ("rollout.pipeline=sometimes", ["rollout.pipeline", "auto, on or off"]),
        ("rollout.speculation=always", ["rollout.speculation", "off, auto or on"]),
        ("rollout.speculation_max_draft=0", ["rollout.speculation_max_draft", "at least 1"]),
        ("rollout.speculation_min_acceptance=2", ["rollout.speculation_min_acceptance", "in [0, 1]"]),
        ("rollout.speculation_cost_ratio=0", ["rollout.speculation_cost_ratio", "greater than 0"]),
        ("task.lengths_file=/no/such/file", ["task.lengths_file", "one integer per line"]),
        ("rollout.start_timeout_s=0", ["rollout.start_timeout_s", "a positive number of seconds"]),
        ("trainer.clip_low=0", ["trainer.clip_low", "in (0, 1)"]),
        ("trainer.clip_high=0", ["trainer.clip_high", "positive"]),
        ("trainer.is_cap=0", ["trainer.is_cap", "positive"]),
        ("run.samples_every=-1", ["run.samples_every", "0 (no samples) or a number of trainer steps"]),
        ("run.samples_per_step=0", ["run.samples_per_step", "at least 1"]),
        ("run.verbose=loud", ["run.verbose", "true or false"]),
        ("repack.max_age=-2", ["repack.max_age", "null (none) or >= 0"]),
        ("schedule.max_lag=-3", ["schedule.max_lag", "null (none) or >= 0"]),
    ],
)
def test_bad_values_name_the_field_and_what_is_valid(override, names):
    with pytest.raises(ConfigError) as err:
        load_config(None, override.split())
    for name in names:
        assert name in str(err.value)


def test_none_is_null_and_the_older_minus_one_reads_as_null(tmp_path):
    """A bound or age that may be none takes YAML's null; -1, its spelling before null, still loads as none."""
    path = tmp_path / "c.yaml"
    path.write_text("repack:\n  max_age: null\nbuffer:\n  max_staleness: -1\nschedule:\n  max_lag: 2\n")
    cfg = load_config(path, ["schedule.max_staleness=-1", "schedule.max_lag=null"])
    assert cfg.repack.max_age is None and cfg.buffer.max_staleness is None
    assert cfg.schedule.max_lag is None and cfg.schedule.max_staleness is None
    assert load_config(None, ["buffer.max_staleness=3"]).buffer.max_staleness == 3


def test_on_and_off_read_as_such_from_yaml_and_overrides(tmp_path):
    """YAML 1.1 reads `on` and `off` as booleans; the fields that take them get the words."""
    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  packing: on\nrollout:\n  pipeline: off\n")
    cfg = load_config(path, ["rollout.pipeline=on"])
    assert cfg.trainer.packing == "on" and cfg.rollout.pipeline == "on"
    assert load_config(path).rollout.pipeline == "off"


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "text, says",
    [
        (b"trainer:\n  steps: [4\nrollout: {\n", "expected ',' or ']', but got ':' at line 3, column 8"),
        (b"a: b\n\tc: d\n", "found character '\\t' that cannot start any token at line 2, column 1"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text (byte 0)"),
    ],
)
def test_a_config_file_that_is_not_yaml_is_one_line(tmp_path, text, says):
    path = tmp_path / "run.yaml"
    path.write_bytes(text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == f"config file {str(path)!r} is not YAML: {says}"


@pytest.mark.parametrize("path", sorted(Path(__file__).parent.parent.glob("configs/*.yaml")), ids=str)
def test_every_shipped_config_loads(path, tiny_model_dir):
    """The configs under configs/ are run as they are; each must load and validate (the model they name is
    written on the machine that runs them, so a local one stands in)."""
    cfg = load_config(path, [f"model.path={tiny_model_dir}"])
    assert cfg.model.path == str(tiny_model_dir)


def test_trainer_options_parse():
    cfg = load_config(
        None,
        [
            "trainer.kl_coef=0.01",
            "trainer.mini_batches=4",
            "trainer.filter_groups=true",
            "run.wandb_project=x",
        ],
    )
    t = cfg.trainer
    assert (t.kl_coef, t.mini_batches, t.filter_groups, cfg.run.wandb_project) == (0.01, 4, True, "x")
    assert (load_config().trainer.kl_coef, load_config().trainer.filter_groups) == (0.0, False)


def test_watching_options_parse_and_default_to_samples_every_10_steps_and_no_noise():
    run = load_config().run
    assert (run.samples_every, run.samples_per_step, run.verbose) == (10, 4, False)
    run = load_config(None, ["run.samples_every=0", "run.samples_per_step=2", "run.verbose=true"]).run
    assert (run.samples_every, run.samples_per_step, run.verbose) == (0, 2, True)


def test_a_demo_learning_rate_on_a_real_model_warns_in_one_line(tiny_model_dir):
    assert lr_warning(load_config()) is None  # the demo's own model: its lr is right for it
    assert lr_warning(load_config(None, [f"model.path={tiny_model_dir}", "trainer.lr=1e-5"])) is None
    line = lr_warning(load_config(None, [f"model.path={tiny_model_dir}"]))
    assert "trainer.lr=0.0006" in line and "1e-6 to 1e-5" in line
    assert "\n" not in line
    # LoRA adapters take a larger rate: 2e-4 is usual, 6e-4 still fine, above 1e-3 warned about
    lora = [f"model.path={tiny_model_dir}", "trainer.lora_rank=16"]
    assert lr_warning(load_config(None, [*lora, "trainer.lr=2e-4"])) is None
    assert lr_warning(load_config(None, lora)) is None
    line = lr_warning(load_config(None, [*lora, "trainer.lr=3e-3"]))
    assert "above 0.001" in line and "1e-4 to 5e-4 for LoRA" in line


def test_decoupled_ppo_with_one_update_a_step_warns_that_its_clip_never_binds():
    assert correction_warning(load_config()) is None  # correction=none: the clip is against the sampler's
    for mode in ("tis", "mis"):
        line = correction_warning(load_config(None, [f"trainer.correction={mode}"]))
        assert f"trainer.correction={mode} with trainer.mini_batches=1" in line and "never binds" in line
        assert "\n" not in line
        # from the second update of a step on, the trainer's pre-step log-probs differ from the policy's
        assert (
            correction_warning(load_config(None, [f"trainer.correction={mode}", "trainer.mini_batches=2"]))
            is None
        )


def test_a_random_initialised_model_has_no_learning_rate_to_warn_about(tmp_path):
    import json
    import shutil

    (tmp_path / "random_model.json").write_text(json.dumps({"random_init": True}))
    assert lr_warning(load_config(None, [f"model.path={tmp_path}"])) is None
    shutil.move(tmp_path / "random_model.json", tmp_path / "other.json")
    assert "trainer.lr=0.0006" in lr_warning(load_config(None, [f"model.path={tmp_path}"]))


def test_a_tool_that_does_not_load_is_named_before_anything_starts():
    with pytest.raises(ConfigError, match=r"task.tools=\['nope'\].*not a built-in tool"):
        load_config(None, ["task.tools=[nope]"])
    with pytest.raises(ConfigError, match="task.max_turns=0"):
        load_config(None, ["task.max_turns=0"])
    assert load_config(None, ["task.tools=[python,calculator]"]).task.tools == ["python", "calculator"]


@pytest.mark.parametrize(
    ("field", "value"),
    [(f, v) for f in ("clip_low", "clip_high", "is_cap") for v in (-1, 0, 1e-9, 0.5, 0.99, 1, 5)],
)
def test_the_run_config_accepts_exactly_what_the_loss_accepts(field, value):
    """A value the loss would refuse once Ray has started is refused when the config is read, and the reverse."""
    from laminar.trainer.grpo import GRPOConfig

    try:
        cfg = load_config(None, [f"trainer.{field}={value}"])
        GRPOConfig.of(cfg.trainer, cfg.rollout)  # the loss the trainer builds from it
        config_ok = True
    except ConfigError:
        config_ok = False
    try:
        GRPOConfig(**{field: value})
        loss_ok = True
    except ValueError:
        loss_ok = False
    assert config_ok == loss_ok, f"trainer.{field}={value}: run config {config_ok}, loss {loss_ok}"
