"""Checkpoint files that hold no pickles: tensors in safetensors, everything else in JSON.

A checkpoint is read back on `--resume`, possibly from a shared disk. A pickle (or `torch.load` without
`weights_only`) runs whatever code the file names, so a checkpoint here is data only: a replaced file fails to
parse and the error names it, it never executes anything.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from laminar.jsonio import write_json


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or not what it should be; the message names the file."""


def read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; expected the {what} (JSON) of a Laminar checkpoint")
    try:
        return json.loads(path.read_bytes().decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as e:
        raise CheckpointError(
            f"{path}: not valid JSON ({e}); expected the {what} of a Laminar checkpoint"
        ) from e


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite constant {name}")


def read_tensors(path: Path, what: str) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; expected the {what} (safetensors) of a Laminar checkpoint")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({e}); expected the {what}") from e


# ---- trainer state: optimizer and RNG ------------------------------------------------------------------------
def save_trainer_state(
    out: Path, optimizer_state: dict[str, Any], rng: dict[str, Any], meta: dict[str, Any]
) -> None:
    """`trainer_state.safetensors` (optimizer moments, torch and numpy RNG) and `trainer_state.json` (the rest)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in optimizer_state["state"].items():
        for name, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = value
    tensors["rng.torch"] = rng["torch"].contiguous()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = rng["numpy"]
    tensors["rng.numpy_keys"] = torch.from_numpy(np.asarray(np_keys, dtype=np.int64))
    save_file(tensors, str(out / "trainer_state.safetensors"))
    py_version, py_state, py_gauss = rng["python"]
    write_json(
        out / "trainer_state.json",
        {
            **meta,
            "optimizer": {"param_groups": optimizer_state["param_groups"], "scalars": scalars},
            "rng": {
                "python": [py_version, list(py_state), py_gauss],
                "numpy": [np_name, int(np_pos), int(np_has_gauss), float(np_gauss)],
            },
        },
    )


def load_trainer_state(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(optimizer state_dict, rng, meta) as `save_trainer_state` wrote them; every failure names its file."""
    meta = read_json(path / "trainer_state.json", "trainer step, optimizer groups and RNG")
    tensors = read_tensors(path / "trainer_state.safetensors", "optimizer moments and RNG")
    json_file = path / "trainer_state.json"
    try:
        state: dict[int, dict[str, Any]] = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, idx, name = key.split(".", 2)
                state.setdefault(int(idx), {})[name] = value
        for idx, extra in meta["optimizer"]["scalars"].items():
            state.setdefault(int(idx), {}).update(extra)
        py_version, py_state, py_gauss = meta["rng"]["python"]
        np_name, np_pos, np_has_gauss, np_gauss = meta["rng"]["numpy"]
        rng = {
            "torch": tensors["rng.torch"],
            "python": (int(py_version), tuple(int(x) for x in py_state), py_gauss),
            "numpy": (
                np_name,
                tensors["rng.numpy_keys"].numpy().astype(np.uint32),
                np_pos,
                np_has_gauss,
                np_gauss,
            ),
        }
        optimizer = {"state": state, "param_groups": meta["optimizer"]["param_groups"]}
        version = int(meta["version"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"{json_file} / trainer_state.safetensors: missing or malformed field ({e!r}); "
            "expected what `laminar train` writes"
        ) from e
    if version < 0 or not all(math.isfinite(g.get("lr", 0.0)) for g in optimizer["param_groups"]):
        raise CheckpointError(f"{json_file}: version {version} or a learning rate is out of range")
    return optimizer, rng, {**meta, "version": version}


def verify_checkpoint(path: Path, runtime_state: str) -> None:
    """Parse every file of a run checkpoint (as data) so a bad one stops a resume before any actor starts."""
    read_json(path / runtime_state, "prompt pool, buffer and in-flight frontier")
    load_trainer_state(path)
    weights = path / "model.safetensors"
    if weights.is_file():
        read_tensors(weights, "model weights")
