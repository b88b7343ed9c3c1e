"""CUDA kernels of the engine and the trainer, and the CUDA engine, against their CPU or eager reference paths:
`python -m laminar.cuda_check`. Above both packages, as it checks both.

A plain module (not only pytest) so it runs on a bare GPU machine; tests/engine/test_cuda.py calls the same checks.
"""

from __future__ import annotations

import sys

import torch

from laminar.engine import paged_attention, sampler
from laminar.engine.attention import gather_decode
from laminar.engine.config import ModelConfig, SamplingParams, Speculation
from laminar.engine.engine import Engine


def check_paged_attention(dtype: torch.dtype) -> float:
    """Relative error of the Triton kernel against the gather path, on fresh random caches and block tables."""
    g = torch.Generator(device="cuda").manual_seed(0)
    worst = 0.0
    for bsz, heads, kv, dim, lens_max in [(37, 14, 2, 64, 1100), (5, 28, 4, 128, 300), (64, 32, 8, 128, 40)]:
        bs, nblocks = 16, 4096
        q = torch.randn(bsz, heads, dim, device="cuda", dtype=dtype, generator=g)
        kc = torch.randn(nblocks, bs, kv, dim, device="cuda", dtype=dtype, generator=g)
        vc = torch.randn(nblocks, bs, kv, dim, device="cuda", dtype=dtype, generator=g)
        lens = torch.randint(1, lens_max, (bsz,), device="cuda", generator=g, dtype=torch.int32)
        width = -(-lens_max // bs)
        tables = torch.randperm(nblocks, device="cuda", generator=g)[: bsz * width].view(bsz, width).int()
        ref = gather_decode(q.double(), kc.double(), vc.double(), tables, lens, int(lens.max()))
        out = paged_attention.paged_decode(q, kc, vc, tables, lens)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        assert not out.isnan().any(), "NaN in paged attention output"
        worst = max(worst, err)
    return worst


def check_rope_store(dtype: torch.dtype) -> float:
    """The fused rotation-and-store kernel against `fused.split_rope` plus `attention.store_kv`: the worst
    relative error over q, k and both caches (the same float32 math: zero, or a rounding step in places)."""
    from laminar.engine.attention import AttentionContext, store_kv
    from laminar.engine.fused import split_rope

    g = torch.Generator(device="cuda").manual_seed(2)
    worst = 0.0
    for n, heads, kv, dim in [(37, 14, 2, 64), (5, 28, 4, 128), (256, 9, 3, 64)]:
        qkv = torch.randn(n, (heads + 2 * kv) * dim, device="cuda", dtype=dtype, generator=g)
        angles = torch.rand(n, dim // 2, device="cuda", generator=g) * 100
        cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1)
        slots = torch.randperm(64 * 16, device="cuda", generator=g)[:n]
        caches = [torch.zeros(64, 16, kv, dim, device="cuda", dtype=dtype) for _ in range(4)]
        q, k, v = paged_attention.rope_store(qkv, cos_sin, slots, caches[0], caches[1], heads, kv)
        q_ref, k_ref, v_ref = split_rope(qkv, cos_sin, heads, kv)
        store_kv(k_ref, v_ref, caches[2], caches[3], AttentionContext(is_prefill=False, slot_mapping=slots))
        pairs = [(q, q_ref), (k, k_ref), (v, v_ref), (caches[0], caches[2]), (caches[1], caches[3])]
        for a, b in pairs:
            worst = max(worst, ((a.double() - b.double()).norm() / b.double().norm()).item())
    return worst


def check_gate_up(dtype: torch.dtype) -> float:
    """The fused gate/up/SiLU kernel against the unfused path (one product, then `fused.silu_mul`), in both tile
    configurations, for batches of one row to several row tiles: the worst error relative to the output's
    largest entry."""
    import torch.nn.functional as F

    from laminar.engine import gate_up
    from laminar.engine.fused import silu_mul

    g = torch.Generator(device="cuda").manual_seed(4)
    worst = 0.0
    for rows, hidden, inter in [(1, 896, 4864), (37, 128, 256), (128, 1024, 8448), (300, 896, 8192)]:
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype, generator=g)
        w = torch.randn(2 * inter, hidden, device="cuda", dtype=dtype, generator=g) * hidden**-0.5
        ref = silu_mul(F.linear(x, w)).double()
        for config in (gate_up.WIDE, gate_up.NARROW, None):
            out = gate_up.gate_up_silu(x, w, config).double()
            worst = max(worst, ((out - ref).abs().max() / ref.abs().max()).item())
    return worst


def check_fused_logprobs() -> tuple[float, float]:
    """The trainer's fused log-prob head (Triton softmax over bf16 logits) against its eager path on the same
    bf16 inputs, several chunks, an odd vocabulary, temperature 0.7: the worst relative error of the log-probs,
    and of the gradients of the hidden states and the output layer."""
    from laminar.trainer.logprobs import _ChunkedLogprob, _FusedLogprob

    g = torch.Generator(device="cuda").manual_seed(3)
    vocab, hidden_size, rows = 50_001, 64, 2_500
    h = torch.randn(rows, hidden_size, device="cuda", generator=g).bfloat16().requires_grad_(True)
    w = (torch.randn(vocab, hidden_size, device="cuda", generator=g) * 0.3).requires_grad_(True)
    targets = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    upstream = torch.randn(rows, device="cuda", generator=g)
    results = []
    for fn in (_FusedLogprob, _ChunkedLogprob):
        h.grad = w.grad = None
        logp = fn.apply(h, w, targets, 0.7, torch.bfloat16, 900)
        (logp * upstream).sum().backward()
        results.append((logp.detach().double(), h.grad.double(), w.grad.double()))
    (lp, gh, gw), (lp_ref, gh_ref, gw_ref) = results
    value = ((lp - lp_ref).norm() / lp_ref.norm()).item()
    grads = max(((a - b).norm() / b.norm()).item() for a, b in ((gh, gh_ref), (gw, gw_ref)))
    return value, grads


def check_sampler() -> tuple[float, float]:
    """Fraction of rows where the Triton sampler picks the torch path's token, and the worst log-prob gap, on
    float32 logits and on bfloat16 ones (what the decode graphs hand it)."""
    g = torch.Generator(device="cuda").manual_seed(1)
    logits = torch.randn(64, 151936, device="cuda", generator=g) * 4
    temps = torch.rand(64, device="cuda", generator=g) + 0.3
    temps[:8] = 0
    keys = sampler.row_keys(torch.arange(64, device="cuda") * 7919, torch.arange(64, device="cuda") + 100)
    t_ref, lp_ref = sampler.sample_torch(
        logits, temps, keys, torch.zeros(64, dtype=torch.int64, device="cuda"), torch.ones(64, device="cuda")
    )
    t_tri, lp_tri = sampler.sample_triton(logits, temps, keys)
    half = logits.bfloat16()
    zeros, ones = torch.zeros(64, dtype=torch.int64, device="cuda"), torch.ones(64, device="cuda")
    t_ref16, lp_ref16 = sampler.sample_torch(half.float(), temps, keys, zeros, ones)
    t_tri16, lp_tri16 = sampler.sample_triton(half, temps, keys)
    same = min((t_ref == t_tri).float().mean().item(), (t_ref16 == t_tri16).float().mean().item())
    return same, max((lp_ref - lp_tri).abs().max().item(), (lp_ref16 - lp_tri16).abs().max().item())


def tiny_config() -> ModelConfig:
    return ModelConfig(
        family="qwen2",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        qkv_bias=True,
    )


def run(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> dict:
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(**{**params.__dict__, "seed": i}))
    return run_added(engine)


def check_engine_against_cpu() -> dict:
    """Same weights on CPU (fp32, gather path) and CUDA (fp32, Triton + graphs): greedy and sampled agreement."""
    cfg = tiny_config()
    cpu = Engine(cfg, max_model_len=300, max_num_seqs=16)
    state = {k: v.clone() for k, v in cpu.runner.model.state_dict().items()}
    for v in state.values():  # larger weights than PyTorch's default init, so tokens vary
        v.mul_(3)
    cpu.load_state_dict(state, 0)
    gpu = Engine(cfg, weights=state, device="cuda", max_model_len=300, max_num_seqs=16)
    assert gpu.runner.graphs, "no CUDA graphs captured"
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(2, 512, (int(n),), generator=gen).tolist()
        for n in torch.randint(3, 60, (11,), generator=gen)
    ]
    res = {}
    for name, params in [
        ("greedy", SamplingParams(temperature=0, max_new_tokens=80, ignore_eos=True)),
        ("sampled", SamplingParams(temperature=1.0, max_new_tokens=80, ignore_eos=True)),
    ]:
        a, b = run(cpu, prompts, params), run(gpu, prompts, params)
        same = sum(a[k].output_token_ids == b[k].output_token_ids for k in a)
        gap = max(
            max(abs(x - y) for x, y in zip(a[k].logprobs, b[k].logprobs))
            for k in a
            if a[k].output_token_ids == b[k].output_token_ids
        )
        res[name] = {"identical_requests": f"{same}/{len(a)}", "max_logprob_gap": gap}
    # export half-way from one CUDA engine, import into another: same tokens as never moving
    params = SamplingParams(temperature=1.0, max_new_tokens=60, ignore_eos=True, seed=5)
    want = run(Engine(cfg, weights=state, device="cuda", max_model_len=300), [prompts[0]], params)["r0"]
    src = Engine(cfg, weights=state, device="cuda", max_model_len=300)
    dst = Engine(cfg, weights=state, device="cuda", max_model_len=300)
    src.add_request("r0", prompts[0], SamplingParams(**{**params.__dict__, "seed": 0}))
    src.add_request("x", prompts[1], params)
    for _ in range(25):
        src.step()
    dst.add_request("y", prompts[2], params)
    dst.import_request(src.export_request("r0"))
    got = {}
    while dst.has_unfinished():
        for f in dst.step().finished:
            got[f.request_id] = f
    res["export_import_identical"] = got["r0"].output_token_ids == want.output_token_ids
    # the same move with the request's keys and values: nothing but the last sampled token prefilled again
    src = Engine(cfg, weights=state, device="cuda", max_model_len=300)
    dst = Engine(cfg, weights=state, device="cuda", max_model_len=300)
    src.add_request("r0", prompts[0], SamplingParams(**{**params.__dict__, "seed": 0}))
    for _ in range(25):
        src.step()
    dst.import_request(src.export_request("r0", with_kv=True))
    got = {}
    while dst.has_unfinished():
        for f in dst.step().finished:
            got[f.request_id] = f
    res["export_import_with_kv_identical"] = got["r0"].output_token_ids == want.output_token_ids
    res["export_import_with_kv_prefilled"] = dst.prefill_tokens
    return res


def check_pipeline() -> dict:
    """The pipelined CUDA engine (each decode step queued before the last one's tokens reach the host, the
    default with graphs) against the same engine step by step: requests of varied length limits and stop tokens,
    so queued rows are dropped as requests end."""
    cfg = tiny_config()
    state = {k: v.mul(3) for k, v in Engine(cfg, max_model_len=300).runner.model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 512, (int(n),), generator=gen).tolist() for n in torch.randint(3, 60, (13,))]
    res = {}
    for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
        outs = []
        for pipeline in (False, True):
            e = Engine(
                cfg, weights=state, device="cuda", max_model_len=300, max_num_seqs=16, pipeline=pipeline
            )
            for i, p in enumerate(prompts):
                stop = tuple(range(2, 40)) if i % 3 == 0 else ()
                e.add_request(
                    f"r{i}",
                    p,
                    SamplingParams(temperature=temp, max_new_tokens=10 + 9 * i, stop_token_ids=stop, seed=i),
                )
            outs.append(run_added(e))
        a, b = outs
        res[name] = f"{sum(a[k].output_token_ids == b[k].output_token_ids for k in a)}/{len(a)}"
    return res


def check_speculation() -> dict:
    """The CUDA engine with speculation on against it off, float32: groups of 8 samples of 3 prompts, 3 requests
    at a time (later samples draft from earlier ones, verified inside the decode graphs), greedy and sampled,
    with stop tokens. Requests with identical tokens, the largest log-prob gap among them, and the draft tokens
    accepted of those verified."""
    cfg = tiny_config()
    state = {k: v.mul(3) for k, v in Engine(cfg, max_model_len=300).runner.model.state_dict().items()}
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(2, 512, (int(n),), generator=gen).tolist() for n in (5, 17, 40)]
    res = {}
    for name, temp in (("greedy", 0.0), ("sampled", 1.0)):
        outs = []
        for mode in ("off", "on"):
            e = Engine(
                cfg,
                weights=state,
                device="cuda",
                max_model_len=300,
                max_num_seqs=3,
                speculation=Speculation(mode),
            )
            for g, p in enumerate(prompts):
                for i in range(8):
                    stop = tuple(range(2, 12)) if i % 2 else ()
                    params = SamplingParams(temperature=temp, max_new_tokens=120, stop_token_ids=stop, seed=i)
                    e.add_request(f"g{g}-{i}", p, params)
            outs.append(run_added(e))
            stats = e.stats()
        a, b = outs
        same = [k for k in a if a[k].output_token_ids == b[k].output_token_ids]
        res[name] = {
            "identical_requests": f"{len(same)}/{len(a)}",
            # these weights (x3) make logits large: a batch of other rows moves a log-prob by ~1e-3 alone
            "max_logprob_gap": max(abs(x - y) for k in same for x, y in zip(a[k].logprobs, b[k].logprobs)),
            "accepted": f"{stats.accepted_tokens}/{stats.draft_tokens}",
            "verify_steps": stats.verify_steps,
            "graphs": max(e.runner.graphs, default=0),
        }
    return res


def run_added(engine: Engine) -> dict:
    done = {}
    while engine.has_unfinished():
        for f in engine.step().finished:
            done[f.request_id] = f
    return done


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA: nothing to check")
        return 0
    ok = True
    for dtype, tol in [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)]:
        err = check_paged_attention(dtype)
        ok &= err < tol
        print(f"paged attention {dtype}: rel err {err:.2e} (tol {tol:.0e})")
    for dtype, tol in [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)]:
        err = check_rope_store(dtype)
        ok &= err < tol
        print(f"rotation and cache store {dtype}: rel err {err:.2e} (tol {tol:.0e})")
    for dtype, tol in [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)]:
        err = check_gate_up(dtype)
        ok &= err < tol
        print(f"gate/up product and SiLU in one kernel {dtype}: rel err {err:.2e} (tol {tol:.0e})")
    value, grads = check_fused_logprobs()
    ok &= value < 1e-5 and grads < 2e-2
    print(
        f"trainer log-prob head, fused vs eager (bf16): rel err {value:.2e} (tol 1e-05), grads {grads:.2e} (tol 2e-02)"
    )
    frac, gap = check_sampler()
    ok &= frac >= 0.98 and gap < 1e-3
    print(f"triton sampler vs torch: same token {frac:.3f}, max log-prob gap {gap:.2e}")
    res = check_engine_against_cpu()
    print(f"engine CUDA vs CPU: {res}")
    ok &= (
        res["greedy"]["identical_requests"].split("/")[0] == res["greedy"]["identical_requests"].split("/")[1]
    )
    ok &= res["export_import_identical"]
    ok &= res["export_import_with_kv_identical"] and res["export_import_with_kv_prefilled"] == 1
    res = check_pipeline()
    print(f"engine pipelined vs step by step (CUDA, identical requests): {res}")
    ok &= res["greedy"].split("/")[0] == res["greedy"].split("/")[1]
    res = check_speculation()
    print(f"engine with speculation vs without (CUDA float32): {res}")
    for name in ("greedy", "sampled"):
        n, total = res[name]["identical_requests"].split("/")
        ok &= n == total and res[name]["verify_steps"] > 0
    print("CUDA CHECKS", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
