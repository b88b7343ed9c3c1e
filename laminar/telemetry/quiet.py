"""What a run does not show unless `run.verbose`: Ray's INFO lines (the local instance starting, the connection to
a cluster) and its warning about a blocking `ray.get` inside an async actor (the control actors wait that way on
purpose, with timeouts), and the progress bars and warnings of transformers and huggingface_hub (loading and
writing weights). Errors still show: Ray's own warnings and errors, every actor's stdout and stderr (Ray still
forwards them to the driver), and every exception an actor raises."""

from __future__ import annotations

import logging
import os

# Read by each library when it is imported (or, for Ray's warning, when it would warn): so they are set in the
# environment every actor process starts with, before anything there imports transformers.
QUIET_ENV = {
    "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC": "0",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' bars too: it follows huggingface_hub's switch
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TQDM_DISABLE": "1",  # bars drawn with tqdm itself (transformers' GGUF reader)
}


def actor_env(verbose: bool) -> dict[str, str]:
    """The environment variables the run's actors get (Ray's job `runtime_env`); a variable the user set keeps
    the user's value."""
    return {} if verbose else {k: os.environ.get(k, v) for k, v in QUIET_ENV.items()}


def ray_logging_level(verbose: bool) -> int:
    """The level of Ray's own logger on the driver (`ray.init(logging_level=...)`)."""
    return logging.INFO if verbose else logging.WARNING


def quiet_libraries(verbose: bool, keep_tqdm: bool = False) -> None:
    """The same for this process, called first by a command (`laminar train`, `laminar model import`): the
    variables for the libraries it imports later, the switches for transformers and huggingface_hub, which it
    may have imported already. `keep_tqdm`: bars drawn with tqdm itself still show (the GGUF import's
    conversion bar, tensors done of all with the time left, is that command's progress)."""
    if verbose:
        return
    for key, value in QUIET_ENV.items():
        if not (keep_tqdm and key == "TQDM_DISABLE"):
            os.environ.setdefault(key, value)
    import huggingface_hub.utils
    import transformers.utils.logging

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()
