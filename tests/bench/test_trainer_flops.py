"""`laminar bench trainer`'s FLOP count: the products a step runs, by hand on a small shape and against
PyTorch's own count of a tiny model's forward and backward through the trainer's log-prob module."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from laminar.bench.trainer_workload import step_flops

SMALL = SimpleNamespace(
    hidden_size=8,
    intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    vocab_size=10,
)


def test_a_small_shape_counted_by_hand():
    """One sequence of 3 prompt and 2 response tokens, T = 5. A token's products in a layer: q 8x8, k 8x4,
    v 8x4, o 8x8, gate, up and down 3 x 8x16: 576 multiply-adds, so 2 x 576 x 5 tokens x 2 layers = 11,520
    forward. Attention: 1+2+3+4+5 = 15 causal pairs, each 4 multiply-adds for the score and 4 for the value,
    2 heads, 2 layers: 2 x 8 x 15 x 2 x 2 = 960 forward. Output layer: 2 response rows x 8x10 x 2 = 320.
    The step is 3x the forward."""
    flops = step_flops(SMALL, [(3, 2)])
    assert (flops.layers, flops.attention, flops.output_layer) == (34_560, 2_880, 960)
    assert flops.total == 38_400
    assert step_flops(SMALL, [(3, 2), (3, 2)]).total == 2 * 38_400
    # the prompt/response split moves only the output layer
    moved = step_flops(SMALL, [(1, 4)])
    assert (moved.layers, moved.attention, moved.output_layer) == (34_560, 2_880, 1_920)


def test_head_dim_falls_back_to_hidden_over_heads():
    plain = SimpleNamespace(**{**vars(SMALL), "head_dim": None})
    assert step_flops(plain, [(3, 2)]) == step_flops(SimpleNamespace(**vars(SMALL)), [(3, 2)])


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_count_matches_pytorchs_on_a_tiny_model(family):
    """FlopCounterMode over a forward and backward of `PolicyLogprobs` with eager attention. Its matrix
    products (mm, addmm) are the decoder layers' and the output layer's; the output layer's backward recomputes
    its logits (`_ChunkedLogprob`), one forward's worth more than the model's FLOPs count. Eager attention runs
    the full square of scores and masks it (bmm): T^2 pairs against the T(T+1)/2 counted here. qwen3's
    head_dim (32) is not hidden / heads (16)."""
    from torch.utils.flop_counter import FlopCounterMode

    from laminar.trainer.logprobs import PolicyLogprobs
    from tests.engine.helpers import hf_model

    model = hf_model(family).train()
    policy = PolicyLogprobs(model)
    sequences = [(5, 11), (9, 7), (2, 14)]  # one length, T = 16: no padding
    width = 16
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (len(sequences), width))
    positions = torch.cat(
        [torch.arange(b * width + p - 1, b * width + p - 1 + r) for b, (p, r) in enumerate(sequences)]
    )
    targets = ids.flatten()[positions + 1]
    with FlopCounterMode(display=False) as counter:
        policy(ids, torch.ones_like(ids), positions, targets).sum().backward()
    ran = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    flops = step_flops(model.config, sequences)
    products = ran.get("aten.mm", 0) + ran.get("aten.addmm", 0)
    assert products == flops.layers + flops.output_layer * 4 / 3
    assert ran["aten.bmm"] == flops.attention * 2 * width / (width + 1)
    assert set(ran) <= {"aten.mm", "aten.addmm", "aten.bmm"}, ran


def test_a_new_row_calibrates_the_simulator_by_its_6nd_figure(tmp_path):
    """The cost model charges 6 x parameters x tokens, so a row's `mfu_6nd` sets `train_mfu`, not its `mfu`;
    a row from before the recount has only `mfu`, on that count."""
    from laminar.sim.calibrate import from_trainer_bench
    from laminar.sim.cost import CostModel

    row = dict(params=7.6e9, ranks=2, shape="7b", machine="H100", tokens_per_s=1.0)
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps({**row, "mfu": 0.329, "mfu_6nd": 0.352}))
    old.write_text(json.dumps({**row, "mfu": 0.352}))
    assert from_trainer_bench([new], CostModel(), 7.6e9)[0].train_mfu == 0.352
    assert from_trainer_bench([old], CostModel(), 7.6e9)[0].train_mfu == 0.352
