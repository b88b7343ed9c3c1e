"""Weights as one flat byte buffer plus a small layout (`laminar.engine.layout`): what the relay moves and the engine
maps without copies. This is the tensors' side: writing a state_dict into the buffer and viewing it back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from laminar.engine.layout import ITEMSIZE, WeightLayout

# the tensors' dtypes by the names a layout gives them
DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in ITEMSIZE}


def flatten_state_dict(state_dict: dict[str, torch.Tensor]) -> tuple[WeightLayout, np.ndarray]:
    """A fresh buffer holding every tensor; for the trainer side and tests."""
    layout = WeightLayout.of(state_dict)
    out = np.zeros(layout.total_bytes, dtype=np.uint8)
    flatten_into(state_dict, layout, out)
    return layout, out


def flatten_into(state_dict: dict[str, torch.Tensor], layout: WeightLayout, out: np.ndarray) -> None:
    """Write into a preallocated buffer (shared memory, pinned host memory) laid out by `layout`."""
    if out.dtype != np.uint8 or out.ndim != 1 or out.size < layout.total_bytes:
        raise ValueError(
            f"out must be a 1-D uint8 buffer of >= {layout.total_bytes} bytes, got {out.dtype} {out.shape}"
        )
    dst = torch.from_numpy(out)
    cuda = False
    for e in layout.entries:
        if e.name not in state_dict:
            raise KeyError(f"state_dict has no {e.name!r}, which the layout expects")
        src = state_dict[e.name].detach()
        if tuple(src.shape) != e.shape:
            raise ValueError(f"{e.name}: shape {tuple(src.shape)} does not match the layout's {e.shape}")
        view = dst[e.offset : e.offset + e.nbytes].view(DTYPES[e.dtype]).view(e.shape)
        # from a GPU: queued copies (overlapping when `out` is page-locked) and one wait at the end
        view.copy_(src.to(DTYPES[e.dtype]), non_blocking=src.is_cuda)
        cuda |= src.is_cuda
    if cuda:
        torch.cuda.synchronize()


def unflatten(buffer: np.ndarray | torch.Tensor, layout: WeightLayout) -> dict[str, torch.Tensor]:
    """Zero-copy tensor views into the buffer (they alias it: copy before the buffer is reused)."""
    flat = buffer if isinstance(buffer, torch.Tensor) else torch.from_numpy(np.asarray(buffer))
    if flat.dtype != torch.uint8 or flat.numel() < layout.total_bytes:
        raise ValueError(
            f"buffer must be uint8 with >= {layout.total_bytes} bytes, got {flat.dtype} {flat.numel()}"
        )
    return {
        e.name: flat[e.offset : e.offset + e.nbytes].view(DTYPES[e.dtype]).view(e.shape)
        for e in layout.entries
    }


def load_safetensors_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face model directory's weight files (CPU, memory-mapped): those its
    `model.safetensors.index.json` names, else `model.safetensors`, else every *.safetensors (a checkpoint
    directory also holds the trainer's own safetensors, which are not weights)."""
    import json

    from safetensors.torch import load_file

    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        files = [root / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    elif (root / "model.safetensors").is_file():
        files = [root / "model.safetensors"]
    else:
        files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors in {path}: save the model with save_pretrained(..., safe_serialization=True)"
        )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def staged_copy(
    buffer: torch.Tensor | None, host: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """`host` copied into `buffer` on `device` (grown when too small): the buffer, and its first elements holding
    `host`'s, flat. A contiguous copy from the registered relay slot runs at the link's speed; a strided one (a
    tensor-parallel rank's columns) goes through a pageable host copy first, about ten times slower, so a rank
    copies such a tensor whole and slices it on the device. Copies queued on one stream run in order, so the
    buffer is reused as soon as the next copy is queued."""
    n = host.numel()
    if buffer is None or buffer.numel() < n or buffer.dtype != host.dtype:
        buffer = torch.empty(n, dtype=host.dtype, device=device)
    flat = buffer[:n]
    flat.copy_(host.reshape(-1), non_blocking=True)
    return buffer, flat
