"""LoRA (`trainer.lora_rank`): the trainer trains the adapters alone, publishes the merged model in the base
layout (what the engine loads) or, with `trainer.lora_publish=adapters`, the adapters alone (which the engine adds
to its base), and checkpoints the adapters and their optimizer state, resuming exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from laminar.config import ConfigError, RolloutConfig, TrainerConfig
from laminar.configure import load_config
from laminar.engine import Engine
from laminar.engine.adapters import read_peft_adapter
from laminar.engine.layout import WeightLayout
from laminar.engine.weights import flatten_state_dict
from laminar.trainer.lora import ADAPTER_DIR
from laminar.trainer.state_files import OPTIMIZER_DIR, CheckpointError, check_tensors, load_trainer_state
from laminar.trainer.trainer import Trainer
from tests.trainer.test_engine_agreement import sampled, tiny_model
from tests.trainer.test_trainer import make_groups

RANK, ALPHA, TEMPERATURE = 4, 8.0, 0.7


def lora_trainer(base, compute_dtype: str = "", publish_dtype: str = "", **kw) -> Trainer:
    """A LoRA trainer on `base`; `kw` are run config `trainer.` fields."""
    return Trainer(
        TrainerConfig(lr=1e-2, lora_rank=RANK, lora_alpha=ALPHA, **kw),
        str(base),
        rollout=RolloutConfig(temperature=TEMPERATURE),
        compute_dtype=compute_dtype,
        publish_dtype=publish_dtype,
    )


@pytest.fixture
def base(tmp_path):
    tiny_model().save_pretrained(tmp_path / "base")
    return tmp_path / "base"


def merged_by_hand(tr: Trainer) -> dict[str, torch.Tensor]:
    """W + B A x alpha / rank for every adapted projection, from the trainer's parameters."""
    params = dict(tr.model.named_parameters())
    out = {}
    for name, p in params.items():
        if name.endswith(".base_layer.weight"):
            layer = name.removesuffix(".base_layer.weight")
            a, b = params[f"{layer}.lora_A.default.weight"], params[f"{layer}.lora_B.default.weight"]
            out[f"{layer}.weight"] = p + b @ a * (ALPHA / RANK)
        elif ".lora_" not in name:
            out[name] = p
    return {k: v.detach() for k, v in out.items()}


def test_a_lora_step_trains_the_adapters_alone_and_publishes_the_merged_model(base):
    tr = lora_trainer(base)
    start = {k: v.clone() for k, v in tr.model.state_dict().items()}
    for seed in range(2):  # B moves on the first step (A's gradient is 0 while B is), A on the second
        tr.train_step(make_groups(tr, seed=seed))
    moved = {k for k, v in tr.model.state_dict().items() if not torch.equal(v, start[k])}
    adapters = {n for n, p in tr.model.named_parameters() if p.requires_grad}
    assert moved == adapters and all(".lora_" in n for n in adapters)
    assert len(adapters) == 2 * 7 * 2  # A and B, seven projections, two layers
    assert all(a is b for a, b in zip(tr.optimizer.param_groups[0]["params"], dict(tr._trained()).values()))

    published = tr.named_weights()
    plain = tiny_model().state_dict()
    assert list(published) == list(plain)  # the base layout: names, order and shapes
    want = merged_by_hand(tr)
    for k, v in published.items():
        assert v.shape == plain[k].shape and v.dtype == torch.float32
        assert float((v - want[k]).abs().max()) <= 1e-6, k
    assert torch.equal(published["model.norm.weight"], plain["model.norm.weight"])  # not adapted: the base
    assert not torch.equal(
        published["model.layers.0.mlp.up_proj.weight"], plain["model.layers.0.mlp.up_proj.weight"]
    )
    tr.publish_dtype = "bfloat16"  # a bf16 engine's: the merged fp32 sum, cast once
    for k, v in tr.named_weights().items():
        assert torch.equal(v, want[k].to(torch.bfloat16)), k


def test_the_engine_serves_the_merged_weights_with_the_trainers_log_probs(base):
    tr = lora_trainer(base)
    for seed in range(2):
        tr.train_step(make_groups(tr, seed=seed))
    engine = Engine.from_pretrained(base, max_num_seqs=8)
    engine.load_state_dict(tr.named_weights(), version=tr.version)
    trajs = sampled(engine, TEMPERATURE)  # sampled by the engine from the merged weights
    for t, lp in zip(trajs, tr.response_logprobs(trajs)):
        assert np.allclose(lp, t.logprobs, atol=1e-4), t.traj_id
    hf = tiny_model()
    hf.load_state_dict(tr.named_weights())  # and a plain transformers model takes them as they are
    assert engine.stats().version == tr.version == 2


def max_gap(trajs, logprobs) -> float:
    return max(float(np.abs(np.asarray(lp) - np.asarray(t.logprobs)).max()) for t, lp in zip(trajs, logprobs))


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj", "up_proj"]])
def test_the_engine_adds_the_published_adapters_to_its_base_with_the_trainers_log_probs(base, targets):
    """`trainer.lora_publish=adapters`: the engine keeps the base it loaded and adds each version's B A, each in
    its rows of the fused q/k/v and gate/up matrices (all of them adapted, or some parts only); what it samples
    has the log-probs the trainer's peft model gives, to fp32 precision."""
    tr = lora_trainer(base, lora_publish="adapters", lora_target_modules=targets)
    engine = Engine.from_pretrained(base, max_num_seqs=8)
    at_base = sampled(engine, TEMPERATURE)
    for seed in range(3):  # every version added to the base, not to the version before
        tr.train_step(make_groups(tr, seed=seed))
        layout, flat = flatten_state_dict(tr.named_weights())  # the bytes the relays move
        engine.load_weights(flat, layout, tr.version)
        trajs = sampled(engine, TEMPERATURE)
        assert max_gap(trajs, tr.response_logprobs(trajs)) <= 1e-5
    assert engine.stats().version == tr.version == 3
    assert max_gap(at_base, tr.response_logprobs(at_base)) > 1e-3  # the adapters moved the log-probs


def test_an_adapter_publish_is_the_adapters_alone_sized_by_rank_and_targets(base):
    tr = lora_trainer(base, lora_publish="adapters")
    tr.train_step(make_groups(tr, seed=0))
    published = tr.named_weights()
    params = dict(tr.model.named_parameters())
    for name, t in published.items():  # A as trained, B times alpha / rank: the bytes alone give the weights
        layer, factor = name.split(".lora_")
        want = params[f"{layer}.lora_{factor.removesuffix('.weight')}.default.weight"]
        assert torch.equal(t, want * (ALPHA / RANK) if factor == "B.weight" else want), name

    cfg = tiny_model().config
    h, i = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * h // cfg.num_attention_heads
    sizes = {
        "q": (h, h),
        "k": (h, kv),
        "v": (h, kv),
        "o": (h, h),
        "gate": (h, i),
        "up": (h, i),
        "down": (i, h),
    }
    per_layer = sum(RANK * (fan_in + fan_out) for fan_in, fan_out in sizes.values())
    layout = WeightLayout.of(published)  # every tensor's bytes a multiple of 64: no alignment padding
    assert len(layout.entries) == 2 * 7 * cfg.num_hidden_layers
    assert layout.total_bytes == cfg.num_hidden_layers * per_layer * 4
    merged = WeightLayout.of(lora_trainer(base).named_weights()).total_bytes
    assert layout.total_bytes < merged / 4
    tr.publish_dtype = "bfloat16"
    assert WeightLayout.of(tr.named_weights()).total_bytes == layout.total_bytes // 2


def test_a_resumed_runs_replicas_add_the_checkpoints_adapters_to_the_base(base, tmp_path):
    """What a resume's replicas load with `adapters`: the base from `model.path`, then the checkpoint's `adapter/`
    (peft's files, B unscaled) as the checkpoint's version, which serves the merged model the checkpoint holds."""
    tr = lora_trainer(base, lora_publish="adapters")
    for seed in range(2):
        tr.train_step(make_groups(tr, seed=seed))
    ckpt = tr.save_checkpoint(tmp_path / "ckpt")
    adapters = read_peft_adapter(ckpt / ADAPTER_DIR)
    published = tr.named_weights()
    assert sorted(adapters) == sorted(published)
    assert all(torch.allclose(adapters[k], v, atol=1e-7) for k, v in published.items())
    resumed = Engine.from_pretrained(base, max_num_seqs=8)
    resumed.load_state_dict(adapters, version=2)
    merged = Engine.from_pretrained(ckpt, max_num_seqs=8)  # the checkpoint's merged model
    want = dict(merged.runner.model.named_parameters())
    for name, p in resumed.runner.model.named_parameters():
        assert torch.allclose(p, want[name], atol=1e-6), name


def test_a_lora_checkpoint_is_the_adapters_and_resumes_exactly(base, tmp_path):
    tr = lora_trainer(base)
    for seed in range(2):
        tr.train_step(make_groups(tr, seed=seed))
    ckpt = tr.save_checkpoint(tmp_path / "ckpt")

    # the optimizer's moments and update counts are the adapters' alone; the merged model for the replicas
    _, steps, _, meta = load_trainer_state(ckpt)
    adapters = [n for n, p in tr.model.named_parameters() if p.requires_grad]
    assert sorted(steps) == sorted(adapters) and meta["config"]["lora_rank"] == RANK
    moments = load_file(str(ckpt / OPTIMIZER_DIR / "tensors.safetensors"))
    assert sorted(moments) == sorted(f"{k}.{n}" for n in adapters for k in ("exp_avg", "exp_avg_sq"))
    adapter_bytes = sum(v.numel() * 4 for v in moments.values())
    assert adapter_bytes < sum(p.numel() for p in tr.model.parameters()) * 4 / 2
    assert (ckpt / ADAPTER_DIR / "adapter_config.json").is_file()
    check_tensors(ckpt, steps)  # what a run's resume checks before anything starts
    served = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    for k, v in tr.named_weights().items():
        assert torch.equal(served.state_dict()[k], v), k

    # peft reads the adapters as its own
    from peft import PeftModel

    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base), str(ckpt / ADAPTER_DIR)
    )
    ids = torch.tensor([[1, 3, 5, 7, 9, 2]])
    with torch.no_grad():
        assert torch.allclose(peft_model(ids).logits, served(ids).logits, atol=1e-5)

    again = lora_trainer(base)
    again.load_checkpoint(ckpt)
    assert again.version == 2
    groups = make_groups(tr, seed=5)
    tr.train_step(groups)
    again.train_step(groups)
    for (k, v), w in zip(tr.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(v, w), k

    with pytest.raises(CheckpointError, match="another model's checkpoint"):
        Trainer(TrainerConfig(), str(base)).load_checkpoint(ckpt)


def test_laminar_export_of_a_lora_checkpoint_is_the_merged_model(base, tmp_path):
    from laminar.models.export import export

    tr = lora_trainer(base)
    for seed in range(2):
        tr.train_step(make_groups(tr, seed=seed))
    tr.save_checkpoint(tmp_path / "ckpt")
    out = export(tmp_path / "ckpt", tmp_path / "exported")
    assert not (out / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for k, v in merged_by_hand(tr).items():
        assert float((model.state_dict()[k] - v).abs().max()) <= 1e-6, k


def test_lora_options_are_checked_by_name(base):
    with pytest.raises(ConfigError, match=r"trainer.lora_rank=4 is invalid: 0 with trainer.num_workers > 1"):
        load_config(None, ["trainer.lora_rank=4", "trainer.num_workers=2"])
    with pytest.raises(ConfigError, match="trainer.lora_alpha"):
        load_config(None, ["trainer.lora_rank=4", "trainer.lora_alpha=0"])
    with pytest.raises(ConfigError, match="trainer.lora_target_modules"):
        load_config(None, ["trainer.lora_rank=4", "trainer.lora_target_modules=[]"])
    with pytest.raises(ValueError, match=r"trainer.lora_target_modules=\['c_attn'\].*named \[.*'q_proj'"):
        lora_trainer(base, lora_target_modules=["c_attn"])
    with pytest.raises(
        ConfigError, match=r"trainer.lora_publish='both' is invalid: one of \['merged', 'adapters'\]"
    ):
        load_config(None, ["trainer.lora_rank=4", "trainer.lora_publish=both"])
    with pytest.raises(
        ValueError, match="lora_publish=adapters: model.embed_tokens .Embedding. is not a linear"
    ):
        lora_trainer(base, lora_publish="adapters", lora_target_modules=["embed_tokens", "q_proj"])

    t = load_config(None, ["trainer.lora_rank=8", "trainer.lora_target_modules=[q_proj, v_proj]"]).trainer
    assert (t.lora_rank, t.lora_alpha, t.lora_target_modules) == (8, 16.0, ["q_proj", "v_proj"])
    assert load_config().trainer.lora_rank == 0  # full fine-tuning by default
    assert load_config().trainer.lora_publish == "merged"


def test_all_linear_adapts_every_projection_but_the_output_layer(base):
    tr = lora_trainer(base, lora_target_modules=["all-linear"])
    adapted = {n.split(".lora_")[0] for n, p in tr.model.named_parameters() if p.requires_grad}
    assert len(adapted) == 14 and not any("lm_head" in n for n in adapted)


def test_lora_with_a_bf16_compute_copy_keeps_the_adapters_master_in_fp32(base):
    """The single trainer's mixed precision (on CUDA by default): the bf16 copy runs forward and backward, its
    adapters' gradients go into the fp32 adapters the optimizer updates, and the copy takes them after each
    update; the publish merges from the fp32 master."""
    tr = lora_trainer(base, compute_dtype="bfloat16", publish_dtype="bfloat16")
    assert len(tr.master.pairs) == 28  # the adapters alone are trained and refreshed
    start = {k: v.clone() for k, v in tr.model.state_dict().items()}
    for seed in range(2):
        tr.train_step(make_groups(tr, seed=seed))
    moved = {k for k, v in tr.model.state_dict().items() if not torch.equal(v, start[k])}
    assert moved and all(".lora_" in k for k in moved)
    copy = dict(tr.master.compute.named_parameters())
    assert all(torch.equal(copy[n], p.to(torch.bfloat16)) for n, p in tr.model.named_parameters())
    want = merged_by_hand(tr)
    assert all(torch.equal(v, want[k].to(torch.bfloat16)) for k, v in tr.named_weights().items())
