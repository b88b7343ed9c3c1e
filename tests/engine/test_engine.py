"""Scheduling, sampling streams, moving requests between engines, weight swaps and input errors."""

import pickle

import pytest
import torch

from laminar.engine import Engine, ModelConfig, SamplingParams, flatten_state_dict

from .helpers import drain, engine_for, hf_config, hf_model

PARAMS = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=30, ignore_eos=True, seed=7)


@pytest.fixture(scope="module")
def model():
    return hf_model("qwen2")


def test_export_half_way_and_import_continues_identically(model):
    prompt = list(range(30, 50))
    ref = engine_for(model)
    ref.add_request("r", prompt, PARAMS)
    expected = drain(ref)["r"]

    src, dst = engine_for(model), engine_for(model)
    src.add_request("r", prompt, PARAMS)
    src.add_request("other", [4, 5, 6], PARAMS)
    for _ in range(12):
        src.step()
    exported = pickle.loads(pickle.dumps(src.export_request("r")))
    assert 0 < len(exported.output_token_ids) < PARAMS.max_new_tokens
    assert src.stats().running == 1
    dst.add_request("x", [9, 9, 9, 9], PARAMS)  # a different batch on the receiver
    dst.import_request(exported)
    moved = drain(dst)["r"]
    assert moved.output_token_ids == expected.output_token_ids
    assert moved.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert moved.reprefill_tokens == len(exported.output_token_ids)


def test_a_request_moved_with_its_keys_and_values_continues_without_a_prefill(model):
    """`with_kv`: the receiver takes the cached keys and values and prefills only the last sampled token; the
    tokens and log-probs are those of a request that never moved. A receiver at another version, or without
    the blocks, re-prefills instead; a parked request moves with its cache too and resumes exactly."""
    prompt = list(range(30, 50))
    ref = engine_for(model)
    ref.add_request("r", prompt, PARAMS)
    expected = drain(ref)["r"]

    def moved_half_way(dst, parked: bool = False):
        src = engine_for(model)
        src.add_request("r", prompt, PARAMS)
        for _ in range(12):
            src.step()
        if parked:
            src.park("r")
        exported = pickle.loads(pickle.dumps(src.export_request("r", with_kv=True)))
        assert (
            exported.kv is not None
            and exported.kv.num_tokens == len(prompt) + len(exported.output_token_ids) - 1
        )
        before = dst.prefill_tokens
        dst.import_request(exported)
        if parked:
            assert dst.stats().parked == 1
            assert dst.resume("r", []) is None
        return drain(dst)["r"], dst.prefill_tokens - before

    dst = engine_for(model)
    moved, prefilled = moved_half_way(dst)
    assert moved.output_token_ids == expected.output_token_ids
    assert moved.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
    assert prefilled == 1 and moved.reprefill_tokens == 0  # the last sampled token only
    assert dst.stats().kv_blocks_used == 0  # every block came back

    parked, prefilled = moved_half_way(engine_for(model), parked=True)
    assert parked.output_token_ids == expected.output_token_ids and prefilled == 1

    newer = engine_for(model)
    newer.version = 1  # other weights: the moved cache is not theirs, so it is computed again
    again, prefilled = moved_half_way(newer)
    assert prefilled > 20 and again.reprefill_tokens > 0

    full = engine_for(model, num_kv_blocks=7)  # one block free, two needed: it waits and re-prefills
    full.add_request("x", list(range(60, 150)), SamplingParams(max_new_tokens=2, ignore_eos=True, seed=1))
    full.step()
    assert len(full.blocks.free) == 1
    crowded, prefilled = moved_half_way(full)
    assert crowded.output_token_ids == expected.output_token_ids and prefilled > 20

    # a request ahead of a moved one that cannot start otherwise takes its blocks (it re-prefills later)
    src = engine_for(model)
    src.add_request("r", prompt, PARAMS)
    for _ in range(12):
        src.step()
    ahead = engine_for(model, num_kv_blocks=7)
    ahead.import_request(src.export_request("r", with_kv=True))
    assert len(ahead.blocks.free) == 5
    ahead.add_request("y", list(range(60, 150)), SamplingParams(max_new_tokens=2, ignore_eos=True, seed=1))
    ahead.scheduler.waiting.rotate(1)  # y first: it needs 6 blocks
    done = drain(ahead)
    assert done["r"].output_token_ids == expected.output_token_ids and len(done["y"].output_token_ids) == 2


def test_batch_composition_does_not_change_samples(model):
    prompt = [11, 12, 13, 14]
    alone = engine_for(model)
    alone.add_request("me", prompt, PARAMS)
    solo = drain(alone)["me"].output_token_ids

    crowd = engine_for(model)
    for i in range(5):
        crowd.add_request(
            f"n{i}", [i + 2] * (3 + i), SamplingParams(temperature=0.8, max_new_tokens=10 + i, seed=i)
        )
    crowd.add_request("me", prompt, PARAMS)
    assert drain(crowd)["me"].output_token_ids == solo
    assert len(set(solo)) > 3


def test_seed_and_id_choose_the_stream(model):
    e = engine_for(model)
    e.add_request("a", [5, 6], PARAMS)
    e.add_request("b", [5, 6], PARAMS)  # same seed, other id: a GRPO group's samples must differ
    e.add_request("c", [5, 6], SamplingParams(**{**PARAMS.__dict__, "seed": 8}))
    out = drain(e)
    assert len({tuple(out[k].output_token_ids) for k in "abc"}) == 3


def test_preemption_under_block_pressure_loses_nothing(model):
    roomy = engine_for(model)
    tight = engine_for(model, num_kv_blocks=6, block_size=8)  # 48 slots for 4 requests of up to 38 tokens
    prompts = {f"r{i}": [3 + i] * (5 + i) for i in range(4)}
    for e in (roomy, tight):
        for rid, p in prompts.items():
            e.add_request(rid, p, PARAMS)
    expected, got = drain(roomy), drain(tight)
    assert tight.stats().num_preemptions > 0
    assert set(got) == set(prompts)
    for rid in prompts:
        assert len(got[rid].output_token_ids) == PARAMS.max_new_tokens
        assert got[rid].output_token_ids == expected[rid].output_token_ids
    assert tight.stats().kv_blocks_used == 0
    assert tight.stats().peak_kv_blocks <= 6


def test_load_weights_in_place_switches_to_new_weights(model):
    other = hf_model("qwen2", seed=1)
    params = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    want = engine_for(other)
    want.add_request("r", [7, 8, 9], params)
    want_tokens = drain(want)["r"].output_token_ids

    e = engine_for(model)
    k_cache = e.runner.k_cache.data_ptr()
    e.add_request("r", [7, 8, 9], params)
    before = drain(e)["r"].output_token_ids
    layout, flat = flatten_state_dict(other.state_dict())
    e.load_weights(flat, pickle.loads(pickle.dumps(layout)), version=3)
    e.add_request("r2", [7, 8, 9], params)
    after = drain(e)["r2"]
    assert before != want_tokens
    assert after.output_token_ids == want_tokens
    assert after.version == 3 and e.stats().version == 3
    assert e.runner.k_cache.data_ptr() == k_cache


def test_stats_and_peak(model):
    e = engine_for(model, block_size=4)
    e.add_request("a", list(range(2, 12)), SamplingParams(max_new_tokens=6))
    e.step()
    s = e.stats()
    assert (s.waiting, s.running, s.kv_blocks_used) == (0, 1, 3)
    drain(e)
    s = e.stats()
    assert s.peak_kv_blocks >= 3 and s.kv_blocks_used == 0 and s.tokens_generated == 6
    e.reset_peak()
    assert e.stats().peak_kv_blocks == 0


def test_stop_tokens_and_abort(model):
    e = engine_for(model)
    e.add_request("g", [5, 6, 7], SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True))
    first = drain(e)["g"].output_token_ids
    e.add_request(
        "s", [5, 6, 7], SamplingParams(temperature=0, max_new_tokens=20, stop_token_ids=(first[3],))
    )
    e.add_request("x", [5, 6, 7], SamplingParams(max_new_tokens=20))
    e.step()
    e.abort("x")
    out = drain(e)
    assert "x" not in out
    stop = out["s"]
    assert stop.finish_reason == "stop" and stop.output_token_ids == first[: first.index(first[3]) + 1]


def test_top_k_one_is_greedy(model):
    e = engine_for(model)
    e.add_request("g", [5, 6, 7], SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True))
    e.add_request(
        "k", [5, 6, 7], SamplingParams(temperature=1.0, top_k=1, max_new_tokens=10, ignore_eos=True)
    )
    e.add_request(
        "p", [5, 6, 7], SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=10, ignore_eos=True)
    )
    out = drain(e)
    assert out["g"].output_token_ids == out["k"].output_token_ids == out["p"].output_token_ids


def test_bf16_cpu_runs(model):
    e = engine_for(model, dtype=torch.bfloat16)
    e.add_request("r", [5, 6, 7], PARAMS)
    assert len(drain(e)["r"].output_token_ids) == PARAMS.max_new_tokens


def test_prompt_longer_than_context_is_a_clear_error(model):
    e = engine_for(model, max_model_len=32)
    with pytest.raises(ValueError, match="max_model_len is 32.*at most 31 tokens"):
        e.add_request("long", list(range(2, 40)), PARAMS)


def test_unknown_architecture_is_a_clear_error():
    d = hf_config("qwen2").to_dict() | {"architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    with pytest.raises(ValueError, match="unknown architecture.*MistralForCausalLM.*Qwen2ForCausalLM"):
        ModelConfig.from_hf(d)


def test_missing_weight_is_a_clear_error(model):
    state = dict(model.state_dict())
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(KeyError, match=r"missing weight.*model\.layers\.1\.mlp\.up_proj\.weight"):
        Engine(ModelConfig.from_hf(model.config), weights=state, max_model_len=64)


def test_from_pretrained_reads_a_local_hf_directory(model, tmp_path):
    model.save_pretrained(tmp_path)
    e = Engine.from_pretrained(tmp_path, max_model_len=64)
    ref = engine_for(model)
    for x in (e, ref):
        x.add_request("r", [5, 6, 7], PARAMS)
    assert drain(e)["r"].output_token_ids == drain(ref)["r"].output_token_ids


def test_chunked_gumbel_argmax_draws_exactly_the_one_shot_tokens():
    import torch

    from laminar.engine.sampler import gumbel, gumbel_argmax

    torch.manual_seed(0)
    score = torch.randn(6, 10_000)
    keys = torch.randint(0, 2**32, (6,), dtype=torch.int64)
    greedy = torch.tensor([False, True, False, False, True, False])
    noise = gumbel(keys, score.shape[-1]).masked_fill(greedy[:, None], 0.0)
    expected = (score + noise).argmax(-1)
    assert torch.equal(gumbel_argmax(score, keys, greedy, chunk=999), expected)
