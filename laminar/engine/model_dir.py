"""A model directory as the trainer and the replicas load it: checked before anything starts, with a message that
says what is missing (no torch here: the driver checks a path without loading one)."""

from __future__ import annotations

from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


class ModelPathError(FileNotFoundError):
    """The model path is not a loadable Hugging Face model directory; the message says what is missing."""


def check_model_dir(path: str | Path) -> Path:
    hint = "a Hugging Face model directory with config.json and model.safetensors (make the demo's with `laminar warmup --out DIR`)"
    if not str(path):
        raise ModelPathError(f"no model path given; expected {hint}")
    path = Path(path)
    if not path.exists():
        raise ModelPathError(f"model path {path} does not exist; expected {hint}")
    if not path.is_dir():
        raise ModelPathError(f"model path {path} is a file; pass the directory that holds it, i.e. {hint}")
    have = sorted(p.name for p in path.iterdir())
    if not (path / "config.json").is_file():
        raise ModelPathError(f"model path {path} has no config.json (has {have}); expected {hint}")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ModelPathError(
            f"model path {path} has config.json but no weights: none of {list(WEIGHT_FILES)} (has {have})"
        )
    return path
