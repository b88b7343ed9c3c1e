"""GPU check of the weight path's two ends (a CUDA machine without Ray: a stand-in `ray` calls relays directly).

Trainer end: a 200 MB bf16 state_dict on the GPU published by `WeightPublisher`, with pageable and with
CUDA-registered slots (the stall). Rollout end: two relays over loopback TCP; a reader on the second pulls each
version into GPU tensors with `pull_latest` (mapping per pull) and `SlotReader(pin=True)` (kept, registered
mappings), and every tensor is compared with the trainer's. One NVIDIA GPU; writes $OUT/gpu_check.json (OUT
defaults to /tmp).

    OUT=DIR python3 experiments/relay-gpu-check.py
"""

import concurrent.futures as cf
import json
import os
import sys
import types

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__)
    sys.exit(0)

sys.path.insert(0, os.getcwd())
_pool = cf.ThreadPoolExecutor(8)


def _wait(refs, num_returns=1, timeout=None):
    if timeout != 0:
        cf.wait(refs, timeout=timeout, return_when=cf.FIRST_COMPLETED)
    done = [r for r in refs if r.done()]
    return done, [r for r in refs if not r.done()]


fake = types.ModuleType("ray")
fake.get = lambda x, timeout=None: x.result(timeout) if isinstance(x, cf.Future) else x
fake.wait = _wait
fake.is_initialized = lambda: False
fake.remote = lambda *a, **k: lambda cls: cls
sys.modules["ray"] = fake

import numpy as np  # noqa: E402
import torch  # noqa: E402

from laminar.engine.weights import unflatten  # noqa: E402
from laminar.relay.publisher import WeightPublisher  # noqa: E402
from laminar.relay.pull import SlotReader, pull_latest  # noqa: E402
from laminar.relay.relay import Relay  # noqa: E402


class Handle:
    """What the relay code calls on a Ray handle (`relay.method.remote(...)`), as direct calls."""

    def __init__(self, relay, async_methods=()):
        for name in ("acquire", "release", "ingest"):
            fn = getattr(relay, name)
            remote = (lambda f: lambda *a, **k: _pool.submit(f, *a, **k))(fn) if name in async_methods else fn
            setattr(self, name, types.SimpleNamespace(remote=remote))


g = torch.Generator(device="cuda").manual_seed(0)
state = {
    f"model.layers.{i}.w": torch.randn(10_000_000, generator=g, device="cuda").to(torch.bfloat16)
    for i in range(10)
}
res = {"device": torch.cuda.get_device_name(), "bytes": 200_000_000}

for pin in (False, True):
    master, tail = Relay(f"gpu-master-{pin}", host="127.0.0.1"), Relay(f"gpu-tail-{pin}", host="127.0.0.1")
    master.set_downstream(tail.address())
    pub = WeightPublisher(Handle(master, async_methods=("ingest",)), pin=pin)
    reader = SlotReader(Handle(tail), pin=True)
    stalls, per_pull, kept = [], [], []
    current = None
    for v in range(1, 8):
        for t in state.values():
            t.add_(1)
        torch.cuda.synchronize()
        stalls.append(pub.publish(v, state))
        tail.wait_version(v, timeout=60)
        got = {}

        def load(buf, layout, version, got=got):
            got.clear()
            got.update({k: t.to("cuda", non_blocking=False) for k, t in unflatten(buf, layout).items()})
            torch.cuda.synchronize()

        per_pull.append(pull_latest(Handle(tail), load, current)[1])
        assert all(torch.equal(got[k], state[k]) for k in state), v
        kept.append(reader.pull(load, current)[1])
        assert all(torch.equal(got[k], state[k]) for k in state), v
        current = v
    res[f"publisher_pin_{pin}"] = {
        "stall_s": stalls,
        "stall_median_after_warmup_s": float(np.median(stalls[3:])),
        "pull_latest_median_after_warmup_s": float(np.median(per_pull[3:])),
        "slot_reader_pinned_median_after_warmup_s": float(np.median(kept[3:])),
        "registered_publish_slots": list(pub._registered),
    }
    print(pin, res[f"publisher_pin_{pin}"], flush=True)
    reader.close()
    pub.close()
    master.shutdown()
    tail.shutdown()
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "gpu_check.json"), "w"), indent=2)
