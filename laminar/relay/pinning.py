"""Page-locking shared-memory slots for the GPU (cudaHostRegister).

A copy between a GPU and registered host memory runs at PCIe speed; from pageable memory it runs at a fraction
of it (one H200 host, 200 MB: 53 GB/s against 7.5 GB/s; results/relay/README.md). Slots are registered once
and kept: registering costs about 12 ms per 200 MB.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

PORTABLE = 1  # usable from every CUDA context of the process
READ_ONLY = 8  # the GPU only reads it; needed for a read-only mapping


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def register(arr: np.ndarray, *, read_only: bool) -> bool:
    """Page-lock `arr`'s pages; False (copies stay pageable) when the driver refuses."""
    import torch

    if arr.nbytes == 0:
        return False
    flags = PORTABLE | (READ_ONLY if read_only else 0)
    err = torch.cuda.cudart().cudaHostRegister(arr.ctypes.data, arr.nbytes, flags)
    if int(err) != 0:
        log.warning(
            "cudaHostRegister of a %d-byte weight slot failed (%s); copies stay pageable", arr.nbytes, err
        )
        return False
    return True


def unregister(arr: np.ndarray) -> None:
    import torch

    torch.cuda.cudart().cudaHostUnregister(arr.ctypes.data)
