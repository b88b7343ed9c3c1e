"""A tensor-parallel rank's pull of its column-split weights (o_proj, down_proj) from page-locked host memory, three
ways, on one GPU: the strided host view copied directly (what a rank did before `staged_copy`), the tensor copied
whole and sliced on the device (`laminar.engine.weights.staged_copy`, what the engine does now), and the same
number of bytes copied contiguously (the link's speed: the bound).

    python3 experiments/tensor-parallel-staged-copy.py OUT.json [LAYERS] [HIDDEN] [INTERMEDIATE]

Defaults: 8 layers of the Qwen2.5-14B shape (hidden 5120, intermediate 13824), bf16, TP=2 (rank 0's columns).
Writes OUT.json with GB/s of the rank's bytes for each way (the median of 5 repeats after one warm-up).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from laminar.engine.weights import staged_copy


def timed(fn, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("this measures host-to-GPU copies: run it where CUDA is available")
    out = sys.argv[1]
    layers, hidden, inter = (int(a) for a in (sys.argv[2:5] + ["8", "5120", "13824"][len(sys.argv[2:5]) :]))
    world, rank, dtype, dev = 2, 0, torch.bfloat16, torch.device("cuda")
    # o_proj [hidden, heads x head_dim] and down_proj [hidden, intermediate]: split by columns under TP
    shapes = [(hidden, hidden), (hidden, inter)] * layers
    host = [torch.randn(s, dtype=torch.float32).to(dtype).pin_memory() for s in shapes]
    views = [h.narrow(1, rank * (h.shape[1] // world), h.shape[1] // world) for h in host]
    params = [torch.empty(v.shape, dtype=dtype, device=dev) for v in views]
    rank_bytes = sum(v.numel() * v.element_size() for v in views)
    contiguous = torch.empty(rank_bytes // 2, dtype=dtype).pin_memory()
    target = torch.empty_like(contiguous, device=dev)

    def strided() -> None:
        for p, v in zip(params, views):
            p.copy_(v, non_blocking=True)

    def staged() -> None:
        staging = None
        for p, h in zip(params, host):
            staging, flat = staged_copy(staging, h, dev)
            p.copy_(flat.view(h.shape).narrow(1, rank * (h.shape[1] // world), h.shape[1] // world))

    def link() -> None:
        target.copy_(contiguous, non_blocking=True)

    for p in params:  # the staged copy must give the rank exactly its view's weights
        p.zero_()
    staged()
    torch.cuda.synchronize()
    assert all(torch.equal(p.cpu(), v) for p, v in zip(params, views)), "staged copy differs from the view"
    rows = {name: timed(fn) for name, fn in (("strided", strided), ("staged", staged), ("contiguous", link))}
    result = {
        "machine": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "shape": {
            "layers": layers,
            "hidden": hidden,
            "intermediate": inter,
            "tp": world,
            "dtype": "bfloat16",
        },
        "rank_bytes": rank_bytes,
        "seconds": rows,
        "gb_per_s": {k: rank_bytes / v / 1e9 for k, v in rows.items()},
        "command": "python3 experiments/tensor-parallel-staged-copy.py OUT.json " + " ".join(sys.argv[2:]),
    }
    print(json.dumps(result, indent=1))
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
