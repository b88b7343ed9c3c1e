"""Paged decode attention variants on the decode targets' shapes, then `bench engine` with the best one.

    git show cf89842:laminar/engine/paged_attention.py > DIR/paged_attention_before.py   # the kernel before
    cp results/engine-step/attention-variants/attn_variants.py DIR/
    PYTHONPATH=$PWD python3 DIR/attn_variants.py OUT                                    # on one GPU
"""
import json, os, sys, time
import torch
sys.path.insert(0, os.path.dirname(__file__))
import paged_attention_before as before
from laminar.engine import paged_attention as pa

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
g = torch.Generator(device="cuda").manual_seed(0)
shapes = {"qwen2.5-0.5b": (128, 14, 2, 64), "qwen2.5-7b": (64, 28, 4, 128)}
variants = [(64, 4), (128, 4), (64, 8), (128, 8), (32, 4), (32, 2)]
res = {}
def timeit(fn, reps=200):
    for _ in range(10): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e3 / reps
for name, (bsz, heads, kv, dim) in shapes.items():
    bs, width = 16, 42
    nblocks = bsz * width + 8
    q = torch.randn(bsz, heads, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    kc = torch.randn(nblocks, bs, kv, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    vc = torch.randn(nblocks, bs, kv, dim, device="cuda", dtype=torch.bfloat16, generator=g)
    lens = torch.randint(128, 641, (bsz,), device="cuda", generator=g, dtype=torch.int32)
    tables = torch.randperm(nblocks - 8, device="cuda", generator=g)[: bsz * width].view(bsz, width).int()
    ref = before.paged_decode(q, kc, vc, tables, lens)
    row = {"before": timeit(lambda: before.paged_decode(q, kc, vc, tables, lens))}
    for bn, w in variants:
        out = pa.paged_decode(q, kc, vc, tables, lens, block_n=bn, num_warps=w)
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        row[f"block_n={bn},warps={w}"] = timeit(lambda: pa.paged_decode(q, kc, vc, tables, lens, block_n=bn, num_warps=w))
        row[f"block_n={bn},warps={w} rel err"] = err
    res[name] = row
    print(name, json.dumps({k: round(v, 2) if "err" not in k else v for k, v in row.items()}), flush=True)
score = {f"{bn},{w}": sum(res[n][f"block_n={bn},warps={w}"] / res[n]["before"] for n in res) for bn, w in variants
         if all(res[n][f"block_n={bn},warps={w} rel err"] < 2e-2 for n in res)}
best = min(score, key=score.get)
pa.DECODE_BLOCK_N, pa.DECODE_WARPS = map(int, best.split(","))
res["chosen"] = {"block_n": pa.DECODE_BLOCK_N, "num_warps": pa.DECODE_WARPS, "score": score}
print("chosen", res["chosen"], flush=True)
json.dump(res, open(f"{out_dir}/attn_variants.json", "w"), indent=1)
from laminar.bench.engine import main
main(["--device", "cuda", "--model", "qwen2.5-0.5b", "--batch-sizes", "1", "64", "128", "256", "--hf-batch-sizes",
      "--new-tokens", "512", "--out", f"{out_dir}/curve-0.5b"])
main(["--device", "cuda", "--model", "qwen2.5-7b", "--batch-sizes", "64", "--hf-batch-sizes",
      "--new-tokens", "512", "--out", f"{out_dir}/curve-7b"])
