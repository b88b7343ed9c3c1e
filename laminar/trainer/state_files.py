"""Checkpoint files that hold no pickles: tensors in safetensors, everything else in JSON.

A checkpoint is read back on `--resume`, possibly from a shared disk. A pickle (or `torch.load` without
`weights_only`) runs whatever code the file names, so a checkpoint here is data only: a replaced file fails to
parse and the error names it, it never executes anything.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
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


# ---- trainer state: optimizer groups and steps, RNG ---------------------------------------------------------
def save_trainer_state(
    out: Path,
    param_groups: list[dict[str, Any]],
    steps: dict[str, int],
    rng: dict[str, Any],
    meta: dict[str, Any],
) -> None:
    """`trainer_state.safetensors` (torch and numpy RNG) and `trainer_state.json` (the step, the optimizer's
    groups and each parameter's update count, the rest of the RNG). The moments are in `optimizer/`."""
    tensors = {"rng.torch": rng["torch"].contiguous()}
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = rng["numpy"]
    tensors["rng.numpy_keys"] = torch.from_numpy(np.asarray(np_keys, dtype=np.int64))
    save_file(tensors, str(out / "trainer_state.safetensors"))
    py_version, py_state, py_gauss = rng["python"]
    write_json(
        out / "trainer_state.json",
        {
            **meta,
            "optimizer": {"param_groups": param_groups, "steps": steps},
            "rng": {
                "python": [py_version, list(py_state), py_gauss],
                "numpy": [np_name, int(np_pos), int(np_has_gauss), float(np_gauss)],
            },
        },
    )


def load_trainer_state(
    path: Path,
) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, Any], dict[str, Any]]:
    """(optimizer param_groups, update count per parameter, rng, meta) as `save_trainer_state` wrote them;
    every failure names its file."""
    meta = read_json(path / "trainer_state.json", "trainer step, optimizer groups and RNG")
    tensors = read_tensors(path / "trainer_state.safetensors", "RNG state")
    json_file = path / "trainer_state.json"
    try:
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
        groups = meta["optimizer"]["param_groups"]
        steps = {str(k): int(v) for k, v in meta["optimizer"]["steps"].items()}
        version = int(meta["version"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"{json_file} / trainer_state.safetensors: missing or malformed field ({e!r}); "
            "expected what `laminar train` writes"
        ) from e
    if version < 0 or not all(math.isfinite(g.get("lr", 0.0)) for g in groups):
        raise CheckpointError(f"{json_file}: version {version} or a learning rate is out of range")
    return groups, steps, rng, {**meta, "version": version}


# ---- tensors: one process, or each rank its rows (torch.distributed.checkpoint in safetensors) ----------------
def save_tensors(tensors: dict[str, torch.Tensor], out: Path) -> None:
    """One process's whole tensors into `out/tensors.safetensors`."""
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(out / "tensors.safetensors")
    )


def save_sharded(tensors: dict[str, Any], out: Path, whole: bool) -> None:
    """Every rank calls this with its sharded (DTensor) tensors: each writes its own rows (in parallel).
    `whole`: then rank 0 joins the files into whole tensors in ordinary safetensors files with an index, as
    Hugging Face lays out a model, and removes the per-rank files (the weights, so the checkpoint is a model
    directory); otherwise the per-rank files stay (the optimizer's moments: twice the weights, read back only
    by a resume, which reshards them). Nothing is pickled (the storage format is safetensors)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    out.mkdir(parents=True, exist_ok=True)
    writer = dcp.HuggingFaceStorageWriter(
        str(out), save_distributed=True, enable_consolidation=whole, thread_count=8
    )
    dcp.save(tensors, storage_writer=writer)
    dist.barrier()
    if whole and dist.get_rank() == 0:
        shutil.rmtree(out / "sharded", ignore_errors=True)


def load_tensors(tensors: dict[str, Any], path: Path, world: int) -> None:
    """Fill `tensors` in place (whole tensors, or each rank's rows of DTensors) from the safetensors files in
    `path`, whichever number of ranks wrote them. Every rank of a sharded trainer calls this."""
    import torch.distributed.checkpoint as dcp

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no safetensors files; expected the tensors of a Laminar checkpoint")
    for f in files:
        check_safetensors(f)
    with warnings.catch_warnings():  # one process: DCP says it assumes so
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(tensors, storage_reader=dcp.HuggingFaceStorageReader(str(path)), no_dist=world == 1)


def check_safetensors(f: Path) -> None:
    """Parse a safetensors file's header (not its data: a weights file may be many gigabytes)."""
    try:
        with safe_open(str(f), framework="pt") as handle:
            handle.keys()
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{f}: not a readable safetensors file ({e})") from e


def verify_checkpoint(path: Path, runtime_state: str) -> None:
    """Parse every file of a run checkpoint (as data) so a bad one stops a resume before any actor starts."""
    read_json(path / runtime_state, "prompt pool, buffer and in-flight frontier")
    load_trainer_state(path)
    for f in [*sorted(path.glob("*.safetensors")), *sorted((path / "optimizer").glob("*.safetensors"))]:
        check_safetensors(f)
