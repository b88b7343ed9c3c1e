"""Paged decode attention variants timed the way the engine runs them: one CUDA graph holding every layer's call,
each layer with its own cache (so nothing stays in L2 from one call to the next), on the decode targets' shapes.
Then `laminar bench engine` on both targets, with the engine's kernel as it was and with the fastest variant.

    git checkout f8f4adc -- laminar/engine/paged_attention.py     # the kernels as measured (the prefetching
                                                                  # variant was not kept)
    PYTHONPATH=$PWD python3 results/engine-step/attention-graph/attn_graph.py OUT     # on one GPU
"""

import json
import os
import sys

import torch

from laminar.bench.engine import main as bench_engine
from laminar.bench.engine import time_in_graph
from laminar.engine import paged_attention as pa

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
SHAPES = {  # batch, heads, KV heads, head dim, layers: the targets' rows
    "qwen2.5-0.5b": (128, 14, 2, 64, 24),
    "qwen2.5-7b": (64, 28, 4, 128, 28),
}
VARIANTS = {  # name: (prefetch, block_n, warps, stages)
    "engine (128 tokens, 8 warps, 2 stages)": (False, 128, 8, 2),
    "1 stage": (False, 128, 8, 1),
    "3 stages": (False, 128, 8, 3),
    "64 tokens, 4 warps, 2 stages": (False, 64, 4, 2),
    "64 tokens, 4 warps, 3 stages": (False, 64, 4, 3),
    "64 tokens, 4 warps, 4 stages": (False, 64, 4, 4),
    "32 tokens, 4 warps, 4 stages": (False, 32, 4, 4),
    "prefetch, 128 tokens, 8 warps": (True, 128, 8, 1),
    "prefetch, 128 tokens, 4 warps": (True, 128, 4, 1),
    "prefetch, 64 tokens, 4 warps": (True, 64, 4, 1),
    "prefetch, 64 tokens, 8 warps": (True, 64, 8, 1),
    "prefetch, 32 tokens, 4 warps": (True, 32, 4, 1),
}
BLOCK = 16


def caches(bsz, kv, dim, layers, lens, g):
    """Each layer's caches hold exactly the blocks the batch needs, in a shuffled order."""
    width = -(-int(lens.max()) // BLOCK)
    n = bsz * width
    out = []
    for _ in range(layers):
        kc = torch.randn(n, BLOCK, kv, dim, device="cuda", dtype=torch.bfloat16, generator=g)
        vc = torch.randn(n, BLOCK, kv, dim, device="cuda", dtype=torch.bfloat16, generator=g)
        table = torch.randperm(n, device="cuda", generator=g).view(bsz, width).int()
        out.append((kc, vc, table))
    return out


res = {"device": torch.cuda.get_device_name(), "variants": {k: list(v) for k, v in VARIANTS.items()}}
g = torch.Generator(device="cuda").manual_seed(0)
for name, (bsz, heads, kv, dim, layers) in SHAPES.items():
    for ctx_name, lens in {
        "context 384 (the bench's mean)": torch.full((bsz,), 384, dtype=torch.int32, device="cuda"),
        "contexts 128-640": torch.randint(128, 641, (bsz,), device="cuda", generator=g, dtype=torch.int32),
    }.items():
        cs = caches(bsz, kv, dim, layers, lens, g)
        q = torch.randn(bsz, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
        nbytes = int(lens.sum()) * kv * dim * 2 * 2  # keys and values a layer
        ref = [pa.paged_decode(q, kc, vc, t, lens, 128, 8, 2, False) for kc, vc, t in cs[:1]][0]
        row = {}
        for vname, (pf, bn, w, st) in VARIANTS.items():
            try:
                out = pa.paged_decode(q, cs[0][0], cs[0][1], cs[0][2], lens, bn, w, st, pf)
                err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()

                def run(bn=bn, w=w, st=st, pf=pf):
                    for kc, vc, t in cs:
                        pa.paged_decode(q, kc, vc, t, lens, bn, w, st, pf)

                us = time_in_graph(run, layers)
                row[vname] = {
                    "us_per_layer": round(us, 2),
                    "tb_per_s": round(nbytes / us / 1e6, 3),
                    "rel_err": err,
                }
            except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported, not fatal
                row[vname] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
            print(f"{name:14s} {ctx_name:32s} {vname:42s} {row[vname]}", flush=True)
        res[f"{name} / {ctx_name}"] = row
        del cs
        torch.cuda.empty_cache()


def score(vname):
    rows = [r[vname] for k, r in res.items() if " / " in k]
    if any("error" in r or r["rel_err"] > 2e-2 for r in rows):
        return float("inf")
    base = [r["engine (128 tokens, 8 warps, 2 stages)"]["us_per_layer"] for k, r in res.items() if " / " in k]
    return sum(r["us_per_layer"] / b for r, b in zip(rows, base)) / len(rows)


scores = {v: score(v) for v in VARIANTS}
best = min(scores, key=scores.get)
res["scores (mean time over the engine's kernel)"] = scores
res["chosen"] = best
print("chosen", best, scores[best], flush=True)
json.dump(res, open(f"{out_dir}/attn_graph.json", "w"), indent=1)


def curves(label):
    for model, batch in (("qwen2.5-0.5b", "128"), ("qwen2.5-7b", "64")):
        bench_engine(
            [
                "--device",
                "cuda",
                "--model",
                model,
                "--batch-sizes",
                batch,
                "--hf-batch-sizes",
                "--new-tokens",
                "512",
                "--profile",
                batch,
                "--out",
                f"{out_dir}/{label}-{model}",
            ]
        )


pf, bn, w, st = VARIANTS[best]
pa.DECODE_PREFETCH, pa.DECODE_BLOCK_N, pa.DECODE_WARPS, pa.DECODE_STAGES = pf, bn, w, st
curves("chosen")
pa.DECODE_PREFETCH, pa.DECODE_BLOCK_N, pa.DECODE_WARPS, pa.DECODE_STAGES = False, 128, 8, 2
curves("engine")
