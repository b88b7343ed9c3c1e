"""Weights as one flat byte buffer plus a small layout: what the relay moves and the engine maps without copies."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ALIGN = 64  # each tensor starts on a 64-byte boundary so views are aligned for any dtype and vector loads

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


@dataclass(frozen=True)
class WeightEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str  # a key of DTYPES
    offset: int
    nbytes: int


@dataclass(frozen=True)
class WeightLayout:
    """Where each named tensor lives in the flat buffer; small and picklable, travels on the control plane."""

    entries: tuple[WeightEntry, ...]
    total_bytes: int

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    @classmethod
    def of(cls, state_dict: dict[str, torch.Tensor]) -> WeightLayout:
        return cls.of_specs([(name, tuple(t.shape), t.dtype) for name, t in state_dict.items()])

    @classmethod
    def of_specs(cls, specs: list[tuple[str, tuple[int, ...], torch.dtype]]) -> WeightLayout:
        """From (name, shape, dtype) alone: the ranks of a sharded trainer each compute the same layout."""
        entries, offset = [], 0
        for name, shape, torch_dtype in specs:
            dtype = str(torch_dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                raise TypeError(
                    f"{name}: dtype {torch_dtype} cannot be flattened; expected one of {sorted(DTYPES)}"
                )
            nbytes = math.prod(shape) * torch.empty(0, dtype=torch_dtype).element_size()
            entries.append(WeightEntry(name, tuple(shape), dtype, offset, nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        return cls(tuple(entries), offset)

    @classmethod
    def raw(cls, nbytes: int) -> WeightLayout:
        """One flat uint8 tensor of `nbytes`: benchmarks and tests that move bytes, not a model."""
        return cls((WeightEntry("flat", (nbytes,), "uint8", 0, nbytes),), nbytes)

    def to_json(self) -> dict:
        return {
            "entries": [[e.name, list(e.shape), e.dtype, e.offset, e.nbytes] for e in self.entries],
            "total_bytes": self.total_bytes,
        }

    @classmethod
    def from_json(cls, data: dict) -> WeightLayout:
        """A layout read from the network: every entry must lie inside the buffer, sized by its shape and
        dtype, without overlapping the one before; anything else raises ValueError naming the entry."""
        total = data["total_bytes"]
        if not isinstance(total, int) or total < 0:
            raise ValueError(f"layout total_bytes={total!r}: expected a non-negative integer")
        entries, end = [], 0
        for raw in data["entries"]:
            name, shape, dtype, offset, nbytes = raw
            if not isinstance(name, str) or dtype not in DTYPES:
                raise ValueError(f"layout entry {raw!r}: expected a name and a dtype among {sorted(DTYPES)}")
            if not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ValueError(f"layout entry {name!r}: shape {shape!r} must be non-negative integers")
            itemsize = torch.empty(0, dtype=DTYPES[dtype]).element_size()
            if not isinstance(offset, int) or nbytes != math.prod(shape) * itemsize:
                raise ValueError(
                    f"layout entry {name!r}: {nbytes!r} bytes do not match shape {shape} of {dtype}"
                )
            if offset < end or offset + nbytes > total:
                raise ValueError(
                    f"layout entry {name!r}: bytes [{offset}, {offset + nbytes}) overlap the previous entry "
                    f"or pass the end of the {total}-byte buffer"
                )
            end = offset + nbytes
            entries.append(WeightEntry(name, tuple(shape), dtype, offset, nbytes))
        return cls(tuple(entries), total)


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
