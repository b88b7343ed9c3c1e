"""A run's console without the libraries' noise unless `run.verbose`: Ray's INFO lines and its async-actor
warning, transformers' progress bars and warnings; the actors' output still reaches the driver."""

from __future__ import annotations

import logging

import pytest

from laminar.configure import load_config
from laminar.telemetry.quiet import QUIET_ENV, actor_env


@pytest.mark.parametrize("address", ["", "ray://cluster:10001"])
def test_ray_starts_quiet_unless_verbose_and_keeps_the_actors_output(monkeypatch, address):
    import ray

    from laminar.train import start_ray

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    for key in QUIET_ENV:
        monkeypatch.delenv(key, raising=False)
    start_ray(load_config(None, [f"run.ray_address={address}"]))
    start_ray(load_config(None, [f"run.ray_address={address}", "run.verbose=true"]))
    quiet, verbose = calls
    assert quiet["log_to_driver"] and verbose["log_to_driver"]  # actors' errors and tracebacks still show
    assert quiet["logging_level"] == logging.WARNING and verbose["logging_level"] == logging.INFO
    env = quiet["runtime_env"]["env_vars"]
    assert env["RAY_WARN_BLOCKING_GET_INSIDE_ASYNC"] == "0" and env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert env["TRANSFORMERS_VERBOSITY"] == "error"
    assert verbose["runtime_env"]["env_vars"] == {}


def test_a_variable_the_user_set_keeps_its_value(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    assert actor_env(False)["TRANSFORMERS_VERBOSITY"] == "info"
    assert actor_env(True) == {}


def test_the_import_keeps_its_conversion_bar_and_a_run_does_not(monkeypatch):
    """`laminar model import` shows the GGUF reader's tqdm bar (tensors converted of all, with the time left);
    a run hides every bar."""
    from laminar.telemetry.quiet import quiet_libraries

    for key in QUIET_ENV:
        monkeypatch.delenv(key, raising=False)
    quiet_libraries(False, keep_tqdm=True)
    import os

    assert "TQDM_DISABLE" not in os.environ and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    quiet_libraries(False)
    assert os.environ["TQDM_DISABLE"] == "1"
