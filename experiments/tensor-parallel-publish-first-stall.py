"""The trainer's publish stall for its first versions, with and without the slots prepared at its start
(`WeightPublisher.prepare`: the slots made and page-locked in a background thread before the first publish).

    PYTHONPATH=$PWD python3 experiments/tensor-parallel-publish-first-stall.py OUT.json [GB] [VERSIONS]

On one GPU: a state_dict of GB gigabytes of bf16 tensors (default 8) on the device, published VERSIONS times
(default 5) to a master relay on a one-node Ray cluster, once as the publisher did before (each slot made and
registered by the first publish into it) and once prepared (`prepare`, then waiting for it, as a trainer's start
would while the first rollouts run). Writes OUT.json with every publish's stall, the preparation's time, and a
pinned device-to-host copy of the same bytes (the stall's bound).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: a check of the script, nothing registered


def state_dict(gb: float) -> dict[str, torch.Tensor]:
    """Tensors of 64 MiB of bf16 each, on the GPU, adding to `gb` gigabytes."""
    n = max(1, int(gb * 1e9 / (64 << 20)))
    return {
        f"layer.{i}.weight": torch.randn(4096, 8192, device=DEVICE, dtype=torch.bfloat16) for i in range(n)
    }


def pinned_copy_s(state: dict[str, torch.Tensor]) -> float | None:
    """One device-to-host copy of every tensor into page-locked host memory (median of 3)."""
    if DEVICE != "cuda":
        return None
    host = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in state.items()}
    times = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for k, v in state.items():
            host[k].copy_(v, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[1]


def publishes(master, state, versions: int, prepare: bool, layout_bytes: int) -> dict:
    from laminar.relay.publisher import WeightPublisher

    pub = WeightPublisher(master)
    prepare_s = None
    try:
        if prepare:
            t0 = time.perf_counter()
            pub.prepare(layout_bytes)
            pub.wait_prepared()  # a trainer's start goes on meanwhile; here the wait is timed
            prepare_s = time.perf_counter() - t0
        stalls = []
        for v in range(1, versions + 1):
            stalls.append(pub.publish(v, state))
            import ray

            ray.get(master.wait_version.remote(v, 300), timeout=600)
        return {"prepared": prepare, "prepare_s": prepare_s, "stall_s": stalls}
    finally:
        pub.close()


def main() -> None:
    out = sys.argv[1]
    gb = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
    versions = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    from laminar.engine.layout import WeightLayout
    from laminar.relay.chain import relay_on_node
    from laminar.relay.relay import RelaySettings

    state = state_dict(gb)
    nbytes = WeightLayout.of(state).total_bytes
    ray.init(num_cpus=4, object_store_memory=200 << 20, include_dashboard=False, log_to_driver=False)
    try:
        node = ray.get_runtime_context().get_node_id()
        runs = []
        for i, prepare in enumerate((False, True)):
            master = relay_on_node(node, f"first-stall-{i}", RelaySettings.for_run())
            runs.append(publishes(master, state, versions, prepare, nbytes))
            ray.get(master.shutdown.remote(), timeout=60)
            ray.kill(master)
    finally:
        ray.shutdown()
    result = {
        "machine": torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU",
        "torch": torch.__version__,
        "bytes": nbytes,
        "pinned_copy_s": pinned_copy_s(state),
        "runs": runs,
        "command": "python3 experiments/tensor-parallel-publish-first-stall.py " + " ".join(sys.argv[2:]),
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
