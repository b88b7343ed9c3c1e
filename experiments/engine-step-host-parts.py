"""The host's bookkeeping in a pipelined decode step, on CPU: an Engine on a one-layer model (so the model and
the sampler cost little), each part of a step timed by wrapping it.

    python experiments/engine-step-host-parts.py [BATCH]        # prints microseconds a step, per part
"""

import collections
import sys
import time

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__)
    sys.exit(0)

import torch

from laminar.engine.config import ModelConfig, SamplingParams
from laminar.engine.engine import Engine

torch.set_num_threads(1)
batch = int(sys.argv[1]) if len(sys.argv) > 1 else 128
cfg = ModelConfig(
    family="qwen2",
    max_position_embeddings=2048,
    vocab_size=512,
    hidden_size=16,
    intermediate_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
)
engine = Engine(cfg, max_num_seqs=batch, num_kv_blocks=batch * 50, max_model_len=1024, pipeline=True)
spent = collections.Counter()


def timed(obj, name, key):
    fn = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t = time.perf_counter_ns()
        out = fn(*args, **kwargs)
        spent[key] += time.perf_counter_ns() - t
        return out

    setattr(obj, name, wrapper)


timed(engine.runner.model, "forward", "model")
timed(engine.runner, "_sample", "sampler")
timed(engine.runner, "launch_decode", "launch_decode")
timed(engine, "_launch_next", "_launch_next")
timed(engine, "_collect", "_collect")
g = torch.Generator().manual_seed(0)
for i in range(batch):
    prompt = torch.randint(10, 500, (128,), generator=g).tolist()
    engine.add_request(f"r{i}", prompt, SamplingParams(max_new_tokens=300, ignore_eos=True, seed=i))
while engine.step().is_prefill:
    pass
for _ in range(20):
    engine.step()
spent.clear()
steps = 200
t = time.perf_counter_ns()
for _ in range(steps):
    engine.step()
total = time.perf_counter_ns() - t
us = {k: v / steps / 1e3 for k, v in spent.items()}
print(f"batch {batch}: step {total / steps / 1e3:.0f} us")
print(
    f"  bookkeeping (the step less the model and the sampler): {total / steps / 1e3 - us['model'] - us['sampler']:.0f} us"
)
print(f"  _launch_next less launch_decode: {us['_launch_next'] - us['launch_decode']:.0f} us")
print(
    f"  launch_decode less the model and the sampler: {us['launch_decode'] - us['model'] - us['sampler']:.0f} us"
)
print(f"  _collect (recording the tokens): {us['_collect']:.0f} us")
