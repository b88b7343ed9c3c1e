"""A version's layout: where each named tensor lives in the flat byte buffer that the relay moves and the engine
maps without copies. Plain data, no torch: the relays read layouts off the wire (`laminar.relay.wire`) and never
import torch; the tensors' side of the format (flatten, unflatten) is `laminar.engine.weights`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ALIGN = 64  # each tensor starts on a 64-byte boundary so views are aligned for any dtype and vector loads

# the dtypes a layout may name (torch's names), and their sizes in bytes
ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "uint8": 1,
    "bool": 1,
}


@dataclass(frozen=True)
class WeightEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str  # a key of ITEMSIZE
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
    def of(cls, state_dict: dict[str, Any]) -> WeightLayout:
        """From a state_dict's tensors (their shapes and dtypes)."""
        return cls.of_specs([(name, tuple(t.shape), t.dtype) for name, t in state_dict.items()])

    @classmethod
    def of_specs(cls, specs: list[tuple[str, tuple[int, ...], Any]]) -> WeightLayout:
        """From (name, shape, dtype) alone: the ranks of a sharded trainer each compute the same layout."""
        entries, offset = [], 0
        for name, shape, torch_dtype in specs:
            dtype = str(torch_dtype).removeprefix("torch.")
            if dtype not in ITEMSIZE:
                raise TypeError(
                    f"{name}: dtype {torch_dtype} cannot be flattened; expected one of {sorted(ITEMSIZE)}"
                )
            nbytes = math.prod(shape) * ITEMSIZE[dtype]
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
            if not isinstance(name, str) or dtype not in ITEMSIZE:
                raise ValueError(
                    f"layout entry {raw!r}: expected a name and a dtype among {sorted(ITEMSIZE)}"
                )
            if not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ValueError(f"layout entry {name!r}: shape {shape!r} must be non-negative integers")
            if not isinstance(offset, int) or nbytes != math.prod(shape) * ITEMSIZE[dtype]:
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
