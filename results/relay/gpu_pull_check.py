"""GPU check of the pull path (run on a CUDA machine without Ray: a stand-in `ray` calls the relay directly).

Two in-process relays linked over loopback TCP; versions of 200 MB go in through the master's ingest; a reader
on the second relay pulls each into a CUDA tensor with `pull_latest` (pageable mapping per pull) and with
`SlotReader(pin=True)` (kept, CUDA-registered mappings). Checks bytes on the GPU and writes gpu_pull_check.json.
"""

import json
import os
import sys
import types

sys.path.insert(0, os.getcwd())
fake = types.ModuleType("ray")
fake.get = lambda x, timeout=None: x
fake.is_initialized = lambda: False
fake.remote = lambda *a, **k: lambda cls: cls
sys.modules["ray"] = fake

import numpy as np  # noqa: E402
import torch  # noqa: E402

from laminar.relay.pull import SlotReader, pull_latest  # noqa: E402
from laminar.relay.relay import Relay  # noqa: E402
from laminar.relay.slots import ShmBuffer, new_buffer_path  # noqa: E402


class Handle:
    """What pull code calls on a Ray handle (`relay.acquire.remote(...)`), as direct calls."""

    def __init__(self, relay):
        self.acquire = types.SimpleNamespace(remote=relay.acquire)
        self.release = types.SimpleNamespace(remote=relay.release)


N = 200_000_000
master, tail = Relay("gpu-master", host="127.0.0.1"), Relay("gpu-tail", host="127.0.0.1")
master.set_downstream(tail.address())
src = ShmBuffer(new_buffer_path("gpu-trainer", 0), N)
dst = torch.empty(N, dtype=torch.uint8, device="cuda")


def load(buf, layout, version):
    dst.copy_(torch.from_numpy(buf))
    torch.cuda.synchronize()


res = {"device": torch.cuda.get_device_name(), "bytes": N, "pull_latest_s": [], "slot_reader_pinned_s": []}
reader = SlotReader(Handle(tail), pin=True)
current = None
for v in range(1, 8):
    src.array[:] = v
    src.array[:8] = np.arange(8, dtype=np.uint8) + v
    assert master.ingest(v, src.path, N, {"v": v})
    tail.wait_version(v, timeout=60)
    got = pull_latest(Handle(tail), load, current)
    assert got[0] == v and int(dst[100].item()) == v and int(dst[-1].item()) == v
    res["pull_latest_s"].append(got[1])
    dst.zero_()
    got = reader.pull(load, current)
    assert got[0] == v and int(dst[100].item()) == v and int(dst[-1].item()) == v and int(dst[0].item()) == v
    res["slot_reader_pinned_s"].append(got[1])
    current = v
res["registered"] = [r for _, r in reader._maps.values()]
for k in ("pull_latest_s", "slot_reader_pinned_s"):
    res[k.replace("_s", "_median_after_first_s")] = float(np.median(res[k][3:]))
reader.close()
master.shutdown()
tail.shutdown()
src.close()
print(json.dumps(res, indent=1))
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "gpu_pull_check.json"), "w"), indent=2)
