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
from laminar.trainer.lora import ADAPTER_DIR, ADAPTER_FILE, adapter_param

MOMENTS = ("exp_avg", "exp_avg_sq")  # AdamW's, saved by parameter name in OPTIMIZER_DIR
OPTIMIZER_DIR = "optimizer"


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
    """Parse every file of a run checkpoint (as data) and check that the trainer's tensors are all there with
    the shapes its model's config implies, so a bad one stops a resume before any actor starts."""
    read_json(path / runtime_state, "prompt pool, buffer and in-flight frontier")
    _, steps, _, _ = load_trainer_state(path)
    for f in [*sorted(path.glob("*.safetensors")), *sorted((path / OPTIMIZER_DIR).glob("*.safetensors"))]:
        check_safetensors(f)
    check_tensors(path, steps)


def param_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape by its Hugging Face name (a tied head once, as the trainer saves it), as the
    checkpoint's `config.json` implies: the model is built on the meta device, so nothing is allocated or read."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"{path / 'config.json'}: missing; expected the model's config of a Laminar checkpoint"
        )
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(
            f"{path / 'config.json'}: not a model config transformers can build ({e})"
        ) from e
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def stored_shapes(files: list[Path]) -> dict[str, tuple[tuple[int, ...], Path]]:
    """Each tensor's whole shape and a file that holds it, from the safetensors headers alone. A sharded
    optimizer's per-rank files hold rows of a tensor at the offsets their header records
    (torch.distributed.checkpoint): the whole tensor ends where the last of its rows does."""
    from torch.distributed.checkpoint._hf_utils import CUSTOM_METADATA_KEY, SAVED_OFFSETS_KEY

    shapes: dict[str, tuple[tuple[int, ...], Path]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as handle:
                offsets = json.loads((handle.metadata() or {}).get(CUSTOM_METADATA_KEY) or "{}")
                for key in handle.keys():
                    part = handle.get_slice(key).get_shape()
                    at = offsets.get(key, {}).get(SAVED_OFFSETS_KEY) or [0] * len(part)
                    whole = tuple(n + o for n, o in zip(part, at))
                    if key in shapes:
                        whole = tuple(max(a, b) for a, b in zip(shapes[key][0], whole))
                    shapes[key] = (whole, f)
        except (SafetensorError, OSError, ValueError, AttributeError) as e:
            raise CheckpointError(f"{f}: not a readable safetensors file ({e})") from e
    return shapes


def check_tensors(path: Path, steps: dict[str, int]) -> None:
    """The weights and AdamW's moments (`exp_avg.NAME`, `exp_avg_sq.NAME`) of every parameter the model's
    config implies, with its shape, and an update count for each in `trainer_state.json`. A LoRA checkpoint's
    optimizer holds its adapters' alone, with the shapes of `adapter/`."""
    want = param_shapes(path)
    trained = adapter_shapes(path) or want
    config = path / "config.json"
    extra = sorted(set(steps) ^ set(trained))
    if extra:
        raise CheckpointError(
            f"{path / 'trainer_state.json'}: optimizer.steps names {len(steps)} parameters, {config} implies "
            f"{len(trained)} (first difference: {extra[0]}); every parameter needs its update count"
        )
    optimizer = path / OPTIMIZER_DIR
    weights = [f for f in sorted(path.glob("*.safetensors")) if f.name != "trainer_state.safetensors"]
    moments = sorted(optimizer.glob("*.safetensors"))
    for files, where, what, shapes, names in (
        (weights, path / "model.safetensors", "the trainer's weights", want, {n: n for n in want}),
        (
            moments,
            optimizer,
            "the optimizer's moments",
            trained,
            {f"{k}.{n}": n for n in trained for k in MOMENTS},
        ),
    ):
        if not files:
            raise CheckpointError(
                f"{where}: missing; expected {what} (safetensors) of a Laminar checkpoint, {len(names)} tensors"
            )
        have = stored_shapes(files)
        for key, name in names.items():
            if key not in have:
                raise CheckpointError(
                    f"{where}: tensor {key} is missing; {config} implies {len(names)} tensors here"
                )
            shape, f = have[key]
            if shape != shapes[name]:
                raise CheckpointError(
                    f"{f}: tensor {key} has shape {list(shape)}; {config} implies {list(shapes[name])}"
                )


def adapter_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """A LoRA checkpoint's trained parameters, by the trainer's names, with their shapes (`lora.py`); empty
    for a checkpoint of full fine-tuning, which has no `adapter/`."""
    if not (path / ADAPTER_DIR).exists():
        return {}
    f = path / ADAPTER_DIR / ADAPTER_FILE
    if not f.is_file():
        raise CheckpointError(
            f"{f}: missing; expected the LoRA adapters (safetensors) of a Laminar checkpoint"
        )
    return {adapter_param(k): shape for k, (shape, _) in stored_shapes([f]).items()}
