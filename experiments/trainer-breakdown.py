"""Where a single-GPU trainer step goes: the whole `train_step`, then each part alone (the decoder's forward and
backward, the output layer's log-probs, the optimizer), timed with CUDA events (median of 3 after a warm-up),
and a profile of one step by operator. The batch is the trainer benchmark's (8 groups of 8, prompts of 32,
responses lognormal with median 256 and p99 10x, at most 2048), seed 1.

    python experiments/trainer-breakdown.py SHAPE MICRO_BATCH_TOKENS [COMPUTE_DTYPE] [PROFILE_ROWS]
    e.g. python experiments/trainer-breakdown.py qwen2.5-0.5b 16384 "" 40     (GPU machine)

COMPUTE_DTYPE: '' (the trainer's default: a bf16 compute copy on CUDA) or float32 (fp32 weights under autocast).
"""

import os, sys, time

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__)
    sys.exit(0)
import torch
from transformers import AutoModelForCausalLM
from laminar.bench.trainer import synthetic_groups
from laminar.engine.random_model import shape_config
from laminar.config import TrainerConfig
from laminar.trainer.trainer import Trainer
from laminar.trainer.logprobs import chunked_logprobs

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-0.5b"
mbt = int(sys.argv[2]) if len(sys.argv) > 2 else 16384
dev = torch.device("cuda")
torch.manual_seed(0)
with torch.device(dev):
    model = AutoModelForCausalLM.from_config(shape_config(shape), dtype=torch.float32)
compute = sys.argv[3] if len(sys.argv) > 3 else ""
cfg = TrainerConfig(
    lr=1e-6,
    micro_batch_tokens=mbt,
    num_cpus=8,
    packing="on",
    compile=os.environ.get("BD_COMPILE") == "layers",
)
tr = Trainer(cfg, device="cuda", compute_dtype=compute, publish_dtype="bfloat16", model=model)
print("compile:", os.environ.get("BD_COMPILE", "none"))
vocab = tr.model.config.vocab_size
batches = [synthetic_groups(8, 8, 32, 256, 2048, vocab, s, 10.0) for s in range(4)]


def timeit(fn, n=3):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        t = time.perf_counter()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append((a.elapsed_time(b), 1e3 * (time.perf_counter() - t)))
    return sorted(ts)[len(ts) // 2]


trajs = [t for g in batches[1] for t in g]
ntok = sum(t.num_tokens for t in trajs)
print(f"{shape}: {ntok} tokens a step, micro_batch_tokens {mbt}")
print(
    "compute",
    compute or "default",
    "first step metrics:",
    {
        k: round(v, 5)
        for k, v in tr.train_step(batches[3]).items()
        if k in ("loss", "grad_norm", "ratio_mean", "logprob_mismatch_abs")
    },
)
print("full step (gpu ms, wall ms): %.1f %.1f" % timeit(lambda: tr.train_step(batches[1])))
plan = tr.plan([t.num_tokens for t in trajs])
micro = [mb for _, mbs in plan for mb in mbs]
print("micro-batches:", [sum(trajs[i].num_tokens for i in mb) for mb in micro])
mb = micro[0]
batch = tr._collate([trajs[i] for i in mb], [0.5] * len(mb))
print("collate (wall ms): %.1f" % timeit(lambda: tr._collate([trajs[i] for i in mb], [0.5] * len(mb)))[1])
pol = tr.policy
dec = pol.model.get_decoder()


def dec_fwd():
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        return dec(input_ids=batch["ids"], attention_mask=None, use_cache=False, **batch["packed"]).last_hidden_state


def dec_fwdbwd():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = dec(input_ids=batch["ids"], attention_mask=None, use_cache=False, **batch["packed"]).last_hidden_state
    h.float().sum().backward()


print("decoder fwd (gpu, wall): %.1f %.1f" % timeit(dec_fwd))
print("decoder fwd+bwd: %.1f %.1f" % timeit(dec_fwdbwd))
h = dec_fwd().flatten(0, 1).index_select(0, batch["positions"]).detach().requires_grad_(True)
print("hidden dtype", h.dtype, "rows", h.shape[0])
W = pol.model.get_output_embeddings().weight


def head():
    lp = chunked_logprobs(h, W, batch["targets"], 1.0, torch.bfloat16)
    lp.sum().backward()


def head_fwd():
    with torch.no_grad():
        chunked_logprobs(h, W, batch["targets"], 1.0, torch.bfloat16)


print("logprob head fwd: %.1f %.1f" % timeit(head_fwd))
print("logprob head fwd+bwd: %.1f %.1f" % timeit(head))


def full_mb():
    logp = tr._forward_logprobs(pol, batch)
    logp.sum().backward()


print("policy fwd+bwd one micro-batch: %.1f %.1f" % timeit(full_mb))
print("clip grad norm: %.1f %.1f" % timeit(tr._clip_grad_norm))
print("optimizer step: %.1f %.1f" % timeit(tr.optimizer.step))
from torch.profiler import profile, ProfilerActivity

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    tr.train_step(batches[2])
    torch.cuda.synchronize()
print(
    prof.key_averages().table(
        sort_by="self_cuda_time_total",
        row_limit=int(sys.argv[4]) if len(sys.argv) > 4 else 30,
        max_name_column_width=70,
    )
)
