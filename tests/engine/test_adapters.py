"""A version of LoRA adapters alone (`laminar.engine.adapters`): the engine adds B A to the base it loaded whole,
each sum in its rows of the fused q/k/v and gate/up matrices; a later version starts again from the base, whole
weights become the new base, and a bad version changes nothing."""

from __future__ import annotations

import pytest
import torch

from laminar.engine import Engine
from laminar.engine.config import ModelConfig
from laminar.engine.weights import flatten_state_dict
from tests.trainer.test_engine_agreement import tiny_model

TARGETS = ("self_attn.k_proj", "mlp.up_proj", "self_attn.o_proj")


def adapters(model, rank: int = 3, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random factors for TARGETS of every layer, by the names a publish gives them."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, m in model.named_modules():
        if name.endswith(TARGETS):
            out[f"{name}.lora_A.weight"] = torch.randn(rank, m.in_features, generator=gen)
            out[f"{name}.lora_B.weight"] = torch.randn(m.out_features, rank, generator=gen)
    return out


def served(engine: Engine) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in engine.runner.model.state_dict().items()}


def test_an_adapter_version_is_the_base_plus_b_a_in_the_fused_matrices():
    hf = tiny_model()
    base = {k: v.clone() for k, v in hf.state_dict().items()}
    engine = Engine(ModelConfig.from_hf(hf.config), weights=base, max_num_seqs=4)
    first, second = adapters(hf, seed=0), adapters(hf, seed=1)
    for version, factors in ((1, first), (2, second)):
        layout, flat = flatten_state_dict(factors)
        engine.load_weights(flat, layout, version)  # through the relay's bytes
        params = dict(engine.runner.model.named_parameters())
        for name, want in base.items():
            layer = name.removesuffix(".weight")
            if f"{layer}.lora_A.weight" in factors:  # from the base, never from the last version
                want = want + factors[f"{layer}.lora_B.weight"] @ factors[f"{layer}.lora_A.weight"]
            assert torch.allclose(params[name], want, atol=1e-5), name
        attn = engine.runner.model.model.layers[0].self_attn
        assert attn.k_proj.weight.data_ptr() == attn.qkv_weight[32:].data_ptr()  # still the fused rows
        assert torch.equal(attn.qkv_weight[32:64], params["model.layers.0.self_attn.k_proj.weight"])
        assert engine.version == version
    assert sorted(engine.adapted.base) == sorted(n.replace(".lora_A", "") for n in first if ".lora_A" in n)

    engine.load_state_dict(base, version=3)  # whole weights: the base again, and the next base
    assert not engine.adapted.base
    assert all(torch.equal(v, base[k]) for k, v in served(engine).items() if k in base)


def test_a_bad_adapter_version_changes_nothing():
    hf = tiny_model()
    engine = Engine(ModelConfig.from_hf(hf.config), weights=hf.state_dict(), max_num_seqs=4)
    before = served(engine)
    factors = adapters(hf)
    lone = {k: v for k, v in factors.items() if "layers.1.mlp.up_proj.lora_B" not in k}
    with pytest.raises(KeyError, match=r"layers.1.mlp.up_proj.lora_A.weight' has no lora_B"):
        engine.load_state_dict(lone, version=1)
    wrong = dict(factors, **{"model.layers.1.mlp.up_proj.lora_B.weight": torch.zeros(5, 3)})
    with pytest.raises(ValueError, match=r"layers.1.mlp.up_proj.weight'.*B \(5, 3\) x A \(3, 32\)"):
        engine.load_state_dict(wrong, version=1)
    assert engine.version == 0
    assert all(torch.equal(v, before[k]) for k, v in served(engine).items())
