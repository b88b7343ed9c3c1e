"""Probe: copy a /dev/shm slot to the GPU pageable vs cudaHostRegister'ed, and check a registered mapping
sees the owner's later writes (so a reader may keep it registered across versions). One NVIDIA GPU; writes
$OUT/gpu_pin_probe.json (OUT defaults to /tmp).

    OUT=DIR python3 experiments/relay-gpu-pin-probe.py
"""

import json
import mmap
import os
import sys
import time

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__)
    sys.exit(0)

import numpy as np
import torch

sys.path.insert(0, os.getcwd())
from laminar.relay.slots import ShmBuffer, new_buffer_path

N = 200_000_000
rt = torch.cuda.cudart()
print(torch.__version__, torch.cuda.get_device_name(), hasattr(rt, "cudaHostRegister"))
owner = ShmBuffer(new_buffer_path("probe", 0), N)
owner.array[:] = 1
dst = torch.empty(N, dtype=torch.uint8, device="cuda")
res = {}


def h2d(arr, label, reps=5):
    t = torch.from_numpy(arr)
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(t, non_blocking=False)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    res[label] = {"median_s": float(np.median(ts)), "GBps": N / float(np.median(ts)) / 1e9}
    print(label, res[label])


def mapping(access):
    fd = os.open(owner.path, os.O_RDONLY if access != mmap.ACCESS_WRITE else os.O_RDWR)
    mm = mmap.mmap(fd, N, access=access)
    os.close(fd)
    return mm, np.frombuffer(mm, dtype=np.uint8)


mm, a = mapping(mmap.ACCESS_COPY)
h2d(a, "pageable_copy_mapping")
del a
mm.close()
for name, access, flags in [
    ("read_only_flag_on_ACCESS_READ", mmap.ACCESS_READ, 8),
    ("read_only_flag_on_ACCESS_COPY", mmap.ACCESS_COPY, 8),
    ("default_on_ACCESS_WRITE", mmap.ACCESS_WRITE, 0),
    ("portable_readonly_on_ACCESS_READ", mmap.ACCESS_READ, 1 | 8),
]:
    mm, a = mapping(access)
    t0 = time.perf_counter()
    err = rt.cudaHostRegister(a.ctypes.data, N, flags)
    reg_s = time.perf_counter() - t0
    print(name, "register", err, reg_s)
    if int(err) != 0:
        res[name] = {"error": str(err)}
        del a
        mm.close()
        continue
    h2d(a, name)
    owner.array[:] = 7  # the relay writes a new version into the slot
    dst.copy_(torch.from_numpy(a))
    torch.cuda.synchronize()
    res[name]["sees_new_version"] = bool((dst[:1000] == 7).all().item() and (dst[-1000:] == 7).all().item())
    res[name]["register_s"] = reg_s
    owner.array[:] = 1
    rt.cudaHostUnregister(a.ctypes.data)
    del a
    mm.close()
    print(name, res[name])
owner.close()
os.makedirs(os.environ.get("OUT", "/tmp"), exist_ok=True)
json.dump(
    {"device": torch.cuda.get_device_name(), "bytes": N, **res},
    open(os.path.join(os.environ.get("OUT", "/tmp"), "gpu_pin_probe.json"), "w"),
    indent=2,
)
