"""The decode MLP's first half, timed the way the engine runs it: one CUDA graph holding every layer's call,
each layer with its own weights (nothing stays in L2), on the decode targets' shapes. The engine's path (the
fused gate/up product by cuBLAS, then the compiled SiLU x up) against `laminar.engine.gate_up` in each tile
configuration; then `laminar bench engine` on both targets with the kernel off and with each shape's best.

    PYTHONPATH=$PWD python3 experiments/engine-step-gate-up.py OUT     # on one GPU: OUT/gate_up.json
"""

import itertools
import json
import os
import sys

if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)

import torch
import torch.nn.functional as F

from laminar.bench.engine import main as bench_engine
from laminar.bench.engine import time_in_graph
from laminar.engine import gate_up
from laminar.engine.fused import Fused

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
SHAPES = {
    "qwen2.5-0.5b": (128, 896, 4864, 24),
    "qwen2.5-7b": (64, 3584, 18944, 28),
}  # rows, hidden, I, layers
CONFIGS = [
    (bn, bk, w, st, True) for bn, bk, w, st in itertools.product((32, 64, 128), (64, 128), (4, 8), (3, 4))
]
CONFIGS += [(64, 128, 4, 4, False), (32, 128, 4, 4, False), (128, 64, 8, 3, False)]


fused = Fused(compile=True)
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
best = {}
g = torch.Generator(device="cuda").manual_seed(0)
for name, (rows, hidden, inter, layers) in SHAPES.items():
    ws = [
        torch.randn(2 * inter, hidden, device="cuda", dtype=torch.bfloat16, generator=g) * hidden**-0.5
        for _ in range(layers)
    ]
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=g)
    nbytes = 2 * inter * hidden * 2
    ref = fused.silu_mul(F.linear(x, ws[0]))
    row = {}

    def engine_path():
        for w in ws:
            fused.silu_mul(F.linear(x, w))

    us = time_in_graph(engine_path, layers)
    row["engine: cuBLAS product + compiled SiLU x up"] = {
        "us_per_layer": round(us, 2),
        "tb_per_s": round(nbytes / us / 1e6, 3),
    }
    print(name, "engine path", row["engine: cuBLAS product + compiled SiLU x up"], flush=True)
    for cfg in CONFIGS:
        key = "block_n={},block_k={},warps={},stages={},swap_ab={}".format(*cfg)
        try:
            out = gate_up.gate_up_silu(x, ws[0], cfg)
            err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            us = time_in_graph(lambda cfg=cfg: [gate_up.gate_up_silu(x, w, cfg) for w in ws], layers)
            row[key] = {
                "us_per_layer": round(us, 2),
                "tb_per_s": round(nbytes / us / 1e6, 3),
                "max_rel_err": err,
            }
        except Exception as e:  # noqa: BLE001 - a configuration that does not compile is reported
            row[key] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(name, key, row[key], flush=True)
    ok = {k: v["us_per_layer"] for k, v in row.items() if "max_rel_err" in v and v["max_rel_err"] < 2e-2}
    best[name] = min(ok, key=ok.get)
    res[name] = row
    print(name, "best", best[name], row[best[name]], flush=True)
    del ws
    torch.cuda.empty_cache()
res["best"] = best
json.dump(res, open(f"{out_dir}/gate_up.json", "w"), indent=1)


# the engine's kernel picks each shape's best configuration by its rule (`gate_up.WIDE_FROM`)
for name, batch in (("qwen2.5-0.5b", "128"), ("qwen2.5-7b", "64")):
    for gate_up.ENABLED in (False, True):
        label = "on" if gate_up.ENABLED else "off"
        bench_engine(
            [
                "--device",
                "cuda",
                "--model",
                name,
                "--batch-sizes",
                batch,
                "--hf-batch-sizes",
                "--new-tokens",
                "512",
                "--profile",
                batch,
                "--out",
                f"{out_dir}/{label}-{name}",
            ]
        )
