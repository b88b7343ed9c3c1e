import pickle

import numpy as np
import torch

from laminar.engine.layout import ITEMSIZE
from laminar.engine.weights import DTYPES, flatten_into, flatten_state_dict, unflatten


def test_flatten_round_trip_is_zero_copy_and_aligned():
    state = {
        "a": torch.randn(3, 5),
        "b": torch.randn(7, dtype=torch.float64).to(torch.bfloat16),
        "c": torch.arange(6, dtype=torch.int64).view(2, 3),
    }
    layout, flat = flatten_state_dict(state)
    assert all(e.offset % 64 == 0 for e in layout.entries)
    assert len(pickle.dumps(layout)) < 1000
    views = unflatten(flat, layout)
    for k, v in state.items():
        assert torch.equal(views[k], v)
    flat[layout.entries[0].offset : layout.entries[0].offset + 4] = 0  # views alias the buffer
    assert views["a"][0, 0].item() == 0.0

    shared = np.empty(layout.total_bytes, dtype=np.uint8)
    flatten_into(state, layout, shared)
    assert torch.equal(unflatten(shared, layout)["b"], state["b"])


def test_the_layouts_sizes_are_torchs():
    """The layout (plain data, no torch) sizes each dtype as torch does."""
    assert {name: torch.empty(0, dtype=dt).element_size() for name, dt in DTYPES.items()} == ITEMSIZE
